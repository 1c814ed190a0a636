#!/usr/bin/env python3
# Output throughput of a running gemma4c server (or any OpenAI-compatible one) on prompts of random token ids,
# which need no tokenizer (random-weight checkpoints of the real shapes: gemma4c quantize --random CONFIG DIR
# --type bf16): C concurrent clients send R completions each, P prompt ids and N new tokens (ignore_eos),
# greedy (TEMP 0) or sampled (top-k 64, top-p 0.95); prints output tokens/s over the wall time, and from a gemma4c
# server's /metrics where its engine's time went: per batch step, in the model and in the rest of the engine.
#   bench/server_load_ids.py URL MODEL C R P N TEMP [VOCAB [SHARED]]   (ids drawn from 3 .. VOCAB-1, default
#   262144; the first SHARED prompt ids, default 0, are the same in every request: a system prompt)
import json, random, sys, threading, time, urllib.request
url, model = sys.argv[1], sys.argv[2]
C, R, P, N, temp = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), float(sys.argv[7])
V = int(sys.argv[8]) if len(sys.argv) > 8 else 262144
S = int(sys.argv[9]) if len(sys.argv) > 9 else 0
shared = [random.Random(-1).randrange(3, V) for _ in range(S)]
tokens, errors = [0], []
lock = threading.Lock()
def client(c):
    rnd = random.Random(c)
    for i in range(R):
        body = {"model": model, "prompt": ([2] + shared + [rnd.randrange(3, V) for _ in range(P - 1)])[:P], "max_tokens": N,
                "temperature": temp, "ignore_eos": True, "seed": c * 100 + i}
        if temp > 0: body["top_k"] = 64; body["top_p"] = 0.95
        req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
        try:
            r = json.load(urllib.request.urlopen(req, timeout=600))
            with lock: tokens[0] += r["usage"]["completion_tokens"]
        except Exception as e:
            with lock: errors.append(str(e)[:200])
def metrics():
    try:
        text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    except Exception:
        return {}
    return {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l and not l.startswith("#") and len(l.split()) == 2}
m0 = metrics()
t0 = time.time()
th = [threading.Thread(target=client, args=(c,)) for c in range(C)]
for t in th: t.start()
for t in th: t.join()
dt = time.time() - t0
print(f"{C} clients x {R} requests, prompt {P} ({S} shared), {N} new, temp {temp}: {tokens[0]} tokens in {dt:.1f} s = {tokens[0]/dt:.0f} tok/s, {len(errors)} errors {errors[:2]}")
m1 = metrics()
d = lambda k: m1.get(k, 0) - m0.get(k, 0)
if d("gemma4c_batch_steps_total") > 0:
    n = d("gemma4c_batch_steps_total")
    print(f"  engine: {n:.0f} steps, {1e3 * d('gemma4c_batch_step_seconds_total') / n:.2f} ms a step, of which model "
          f"{1e3 * d('gemma4c_model_seconds_total') / n:.2f} ms; busy {d('gemma4c_worker_busy_seconds_total'):.2f} s of {dt:.1f} s; "
          f"first token {1e3 * d('gemma4c_time_to_first_token_seconds_sum') / max(d('gemma4c_time_to_first_token_seconds_count'), 1):.0f} ms "
          f"on average; {d('gemma4c_prompt_tokens_cached_total'):.0f} of {d('gemma4c_prompt_tokens_total'):.0f} prompt tokens cached")
