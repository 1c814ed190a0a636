"""The requests of tests/test_server_media_url.sh (one output line each; "ok ..." when as expected).
usage: media_client.py SERVER_URL DIR MODE ARGS...
  same IMAGE_URL AUDIO_URL REDIRECT_URL  the fetched files' replies against the data URLs' of DIR's files:
                                         image, image+audio, redirect, base64 in 76-column lines
  same-image IMAGE_URL                   the fetched image's reply against the data URL's
  same-data                              a data URL's reply, twice alike
  error URL                              "STATUS PARAM MESSAGE" of an image_url part with URL
  concurrent SLOW_URL                    a text request while the slow URL is fetched: answered first"""
import base64, json, sys, threading, time, urllib.error, urllib.request

server, folder, mode, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
raw = lambda name: open(f"{folder}/{name}", "rb").read()
b64 = lambda name: base64.b64encode(raw(name)).decode()
lines = lambda s, eol: eol.join(s[i:i + 76] for i in range(0, len(s), 76))  # MIME's 76-column lines


def post(content):
    body = {"model": "ru", "messages": [{"role": "user", "content": content}], "temperature": 0, "max_tokens": 6,
            "ignore_eos": True, "logprobs": True}
    req = urllib.request.Request(f"{server}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        c = json.load(urllib.request.urlopen(req, timeout=300))["choices"][0]
        return (c["message"]["content"], [t["token"] for t in c["logprobs"]["content"]])
    except urllib.error.HTTPError as e:
        err = json.loads(e.read())["error"]
        return f"{e.code} {err['param']} {err['message']}"


image = lambda url: {"type": "image_url", "image_url": {"url": url}}
text = lambda t: {"type": "text", "text": t}
data_image = image("data:image/png;base64," + b64("image0.png"))
data_audio = {"type": "input_audio", "input_audio": {"data": b64("audio0.wav"), "format": "wav"}}


def same(what, got, want):
    ok = isinstance(want, tuple) and got == want
    print(f"ok {what}" if ok else f"FAIL {what}: {got!r} against {want!r}")


if mode == "same":
    img_url, audio_url, redirect_url = args
    want_i = post([data_image, text("What do you see?")])
    same("image", post([image(img_url), text("What do you see?")]), want_i)
    want_ia = post([data_image, data_audio, text("And hear?")])
    same("image+audio", post([image(img_url), {"type": "audio_url", "audio_url": {"url": audio_url}},
                              text("And hear?")]), want_ia)
    same("redirect", post([image(redirect_url), text("What do you see?")]), want_i)
    wrapped_image = image("data:image/png;base64," + lines(b64("image0.png"), "\r\n") + "\n")
    wrapped_audio = {"type": "input_audio", "input_audio": {"data": lines(b64("audio0.wav"), "\n"), "format": "wav"}}
    same("base64 lines", post([wrapped_image, wrapped_audio, text("And hear?")]), want_ia)
elif mode == "same-image":
    same("image", post([image(args[0]), text("What do you see?")]), post([data_image, text("What do you see?")]))
elif mode == "same-data":
    same("data URL", post([data_image, text("What do you see?")]), post([data_image, text("What do you see?")]))
elif mode == "error":
    print(post([image(args[0]), text("What do you see?")]))
elif mode == "concurrent":
    t0 = time.time()
    slow = {}
    th = threading.Thread(target=lambda: slow.update(reply=post([image(args[0]), text("x")]), t=time.time() - t0))
    th.start()
    time.sleep(0.3)
    fast = post([text("Who is Pierre?")])
    t_fast = time.time() - t0
    th.join()
    ok = isinstance(fast, tuple) and t_fast < slow["t"] and str(slow["reply"]).startswith("400 ")
    print(f"{'ok' if ok else 'FAIL'} text reply after {t_fast:.2f} s, the slow fetch's 400 after {slow['t']:.2f} s: "
          f"{str(slow['reply'])[:120]}")
