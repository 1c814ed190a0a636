"""Tests of the gemma4c Python package against what transformers produced (the example model's
reference.json, a fixture's reference.safetensors) and against the C side. Run by
tests/test_api_examples.sh with Debian's python3 after `pip install ./python`:

    python3 test_gemma4c.py TOLSTOY_DIR FIXTURE_DIR ABI_LAYOUT_JSON VERSION
"""
import json
import os
import sys
import threading
import time

import gemma4c

failures = 0


def check(cond, what):
    global failures
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures += 1


def main():
    tolstoy, fixture, layout_path, header_version = sys.argv[1:5]
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
    from cli_compare import read_safetensors

    check(gemma4c.__version__ == gemma4c.library_version() == header_version,
          "versions agree: package %s, library %s, header %s" % (gemma4c.__version__, gemma4c.library_version(),
                                                                 header_version))
    # the ctypes mirrors have the C layout
    layout = json.load(open(layout_path))
    mirrors = {"g4_error": gemma4c._Error, "g4_load_params": gemma4c._LoadParams,
               "g4_context_params": gemma4c._ContextParams, "g4_tokens": gemma4c._Tokens,
               "g4_chat_message": gemma4c._ChatMessage, "g4_sampler_params": gemma4c._SamplerParams,
               "g4_generation_params": gemma4c._GenerationParams, "g4_event": gemma4c._Event}
    for name, cls in mirrors.items():
        want = layout[name]
        got = {f: getattr(cls, f).offset for f, _ in cls._fields_}
        check(want["size"] == gemma4c.ctypes.sizeof(cls) and want["fields"] == got, "%s layout matches C" % name)

    ref = json.load(open(os.path.join(tolstoy, "reference.json")))
    m = gemma4c.Model(tolstoy, threads=2)
    ids = m.tokenize(ref["prompt"])
    check(ids == ref["input_ids"], "tokenize gives transformers' input_ids")
    check(m.tokenize(ref["prompt"], add_bos=False) == ref["input_ids"][1:], "tokenize without BOS")
    check(m.detokenize(ref["greedy_ids"]) == ref["greedy_text"], "detokenize gives transformers' text")
    check(m.detokenize([2] + ref["greedy_ids"], skip_special=True) == ref["greedy_text"], "detokenize skip_special")

    greedy = dict(temperature=0, ignore_eos=True)
    s = m.generate(ids, stream=True, max_tokens=32, **greedy)
    text = "".join(s)
    check(s.reply.tokens == ref["greedy_ids"] and s.reply.finish_reason == "length",
          "generate(ids): transformers' 32 greedy ids")
    check(text == ref["greedy_text"] == s.reply.content, "generate: the streamed text is transformers' text")
    check(m.generate(ref["prompt"], max_tokens=32, **greedy) == ref["greedy_text"], "generate(text) adds BOS")
    check(m.generate(ref["prompt"], max_tokens=32, stop=["rapid"], **greedy) == " with his\n",
          "a stop string ends the text before it")
    a = m.generate(ref["prompt"], max_tokens=16, temperature=1, seed=7)
    check(a == m.generate(ref["prompt"], max_tokens=16, temperature=1, seed=7) and a, "same seed, same text")
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["n"],
              "additionalProperties": False}
    doc = m.generate(ref["prompt"], max_tokens=40, json_schema=schema, temperature=1, seed=3)
    check(doc.startswith("{") and '"n"' in doc and (not doc.endswith("}") or 1 <= json.loads(doc)["n"] <= 9),
          "json_schema: the output follows the schema (%r)" % doc)
    said = m.generate(ref["prompt"], max_tokens=8, grammar='root ::= ("war" | "peace") "."', temperature=1, seed=4)
    check(said in ("war.", "peace."), "grammar: the output is a sentence of the GBNF grammar (%r)" % said)

    msgs = [{"role": "user", "content": ref["chat_user"]}]
    reply = m.chat(msgs, temperature=0, max_tokens=48)
    check(reply.content == ref["chat_greedy_text"].strip() and reply.tokens == ref["chat_greedy_ids"],
          "chat: transformers' greedy answer (%r)" % reply.content[:40])
    check(reply.thinking == "" and reply.tool_calls == [] and reply.finish_reason == "length", "chat: reply fields")
    stream = m.chat(msgs, stream=True, temperature=0, max_tokens=48)
    pieces = list(stream)
    check(len(pieces) > 10 and "".join(pieces) == reply.content == stream.reply.content,
          "chat(stream=True): %d pieces make the same answer" % len(pieces))
    # a second turn after the first: the same as a fresh model given the whole conversation
    turn2 = msgs + [{"role": "assistant", "content": reply.content}, {"role": "user", "content": "And Natasha?"}]
    second = m.chat(turn2, temperature=0, max_tokens=24).content
    with gemma4c.Model(tolstoy, threads=2) as fresh:
        check(second == fresh.chat(turn2, temperature=0, max_tokens=24).content and second,
              "a second turn on the cached conversation equals a fresh run")

    # cancelling: in the loop, from another thread, or by dropping the stream
    s = m.generate(ref["prompt"], stream=True, **greedy)
    for i, _ in enumerate(s):
        if i == 4:
            s.cancel()
    check(s.reply.finish_reason == "cancelled" and len(s.reply.tokens) <= 6, "cancel() in the loop stops it")
    s = m.generate(ref["prompt"], stream=True, **greedy)
    seen = []
    t = threading.Thread(target=lambda: seen.extend(s))
    t.start()
    while len(seen) < 3 and t.is_alive():
        time.sleep(0.001)
    t0 = time.monotonic()
    s.cancel()
    t.join(10)
    check(not t.is_alive() and s.reply.finish_reason == "cancelled",
          "cancel() from another thread returns in %.1f ms" % (1e3 * (time.monotonic() - t0)))
    s = m.chat(msgs, stream=True, temperature=0, max_tokens=48)
    next(s)
    del s  # dropped mid-way: freed
    check(m.chat(msgs, temperature=0, max_tokens=48).content == reply.content, "a dropped stream leaves the model usable")

    # embeddings: the mean of transformers' final hidden states
    ref_t = read_safetensors(os.path.join(fixture, "reference.safetensors"))
    (T, H), final = ref_t["final_norm"]
    want = [sum(final[t * H + h] for t in range(T)) / T for h in range(H)]
    fx = gemma4c.Model(fixture, threads=2, n_ctx=256)
    got = fx.embed(list(ref_t["input_ids"][1]))
    scale = max(abs(x) for x in want)
    err = max(abs(a - b) for a, b in zip(got, want)) / scale
    check(len(got) == H == fx.hidden_size and err < 1e-3, "embed: within %.1e of the mean final hidden state" % err)

    # speculative decoding with a Gemma 4 assistant: transformers' greedy ids (reference of the assistant fixture)
    assistant = os.path.join(os.path.dirname(os.path.abspath(fixture)), "assistant")
    ref_a = read_safetensors(os.path.join(assistant, "reference.safetensors"))
    sp = gemma4c.Model(assistant, threads=2, n_ctx=128, draft=os.path.join(assistant, "assistant-lmhead"), draft_n=5)
    got = sp.generate(list(ref_a["input_ids"][1]), stream=True, max_tokens=24, temperature=0)
    text = "".join(got)
    check(got.reply.tokens == list(ref_a["greedy_ids"][1]), "generate with a drafter: transformers' 24 greedy ids")
    sp.close()

    # errors are exceptions with the library's one-line message
    for what, call in [("a missing folder", lambda: gemma4c.Model("/does/not/exist")),
                       ("no tokenizer", lambda: fx.tokenize("hi")),
                       ("no chat template", lambda: fx.chat(msgs)),
                       ("a bad device", lambda: gemma4c.Model(fixture, device="tpu")),
                       ("a drafter of another model",
                        lambda: gemma4c.Model(fixture, draft=os.path.join(assistant, "assistant-lmhead"))),
                       ("a projector beside a folder (g4_load_params.mmproj)",
                        lambda: gemma4c.Model(fixture, mmproj="/does/not/exist/mmproj.gguf")),
                       ("a bad sampling value", lambda: m.generate("x", top_p=2.0)),
                       ("an unsupported schema keyword", lambda: m.generate("x", json_schema={"pattern": "a"})),
                       ("an undefined GBNF rule", lambda: m.generate("x", grammar="root ::= nothing"))]:
        try:
            call()
            check(False, "%s raises gemma4c.Error" % what)
        except gemma4c.Error as e:
            check(str(e) and "\n" not in str(e), "%s raises gemma4c.Error: %s" % (what, e))
    try:
        m.generate("x", temprature=0)
        check(False, "a misspelt sampling keyword raises TypeError")
    except TypeError:
        check(True, "a misspelt sampling keyword raises TypeError")
    fx.close()
    m.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
