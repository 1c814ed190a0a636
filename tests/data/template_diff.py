#!/usr/bin/env python3
"""Differential check of real chat templates: random conversations rendered by `gemma4c template` and by jinja2
the way transformers' apply_chat_template renders them (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, tojson = json.dumps(ensure_ascii=False), raise_exception, strftime_now; the special tokens of
tokenizer_config.json; messages, tools, add_generation_prompt, enable_thinking and other template kwargs).

The conversations mix what Gemma 4 templates read: system messages (text or a list of parts), user messages with
text / image / audio / video parts, assistant messages with content, reasoning or reasoning_content, tool_calls
(arguments as objects or JSON strings, nested values, unicode) and tool_responses, tool messages, tools with nested
JSON schemas (properties, items, enum, required, nullable, descriptions), and role orders a template may refuse
(then both must fail). Outputs must be equal byte for byte, or both fail.

Usage (needs jinja2: the pyenv python3, not /usr/bin/python3; offline, CI has no jinja2):
    python3 tests/data/template_diff.py [-n 2000] [--seed 1] [--bin build/gemma4c] [TEMPLATE.jinja ...]
Default templates: ../shared/chat_templates/*.jinja and the example model's. Exit status 1 on a mismatch.
"""
import argparse
import datetime
import glob
import json
import os
import random
import subprocess
import sys
import tempfile

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SHARED = os.environ.get("G4_SHARED_DIR", os.path.join(os.path.dirname(ROOT), "shared"))


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


WORDS = ["hello", "Pierre", "Natasha", "the", "weather", "in", "Moscow", "?", "  spaced  ", "line\nbreak", "tab\there",
         "émigré", "日本語", "🙂", "<b>", "{{ not jinja }}", "{% raw %}", "'quote'", '"dq"', "back\\slash", "",
         "<start_of_turn>", "<|turn>", "</s>", "a" * 40]


def text(rng, lo=0, hi=6):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def value(rng, depth=0):
    k = rng.randint(0, 7 if depth < 2 else 4)
    if k == 0:
        return text(rng, 0, 3)
    if k == 1:
        return rng.randint(-1000, 1000)
    if k == 2:
        return rng.choice([0.5, -2.25, 1e-3, 3.0, 1e20])
    if k == 3:
        return rng.choice([True, False, None])
    if k == 4:
        return rng.choice(["", "x", "🙂"])
    if k in (5, 6):
        return {rng.choice(["a", "city", "unit", "n", "ß", "deep"]) + str(i): value(rng, depth + 1)
                for i in range(rng.randint(0, 3))}
    return [value(rng, depth + 1) for _ in range(rng.randint(0, 3))]


def schema(rng, depth=0):
    t = rng.choice(["string", "integer", "number", "boolean", "array", "object"] if depth < 2 else
                   ["string", "integer", "boolean"])
    s = {"type": t}
    if rng.random() < 0.6:
        s["description"] = text(rng, 1, 5)
    if t == "string" and rng.random() < 0.3:
        s["enum"] = [text(rng, 1, 1) for _ in range(rng.randint(1, 3))]
    if t == "array":
        s["items"] = schema(rng, depth + 1)
    if t == "object" or (depth == 0 and rng.random() < 0.5):
        s["type"] = "object"
        s["properties"] = {f"p{i}": schema(rng, depth + 1) for i in range(rng.randint(0, 3))}
        if s["properties"] and rng.random() < 0.6:
            s["required"] = rng.sample(sorted(s["properties"]), rng.randint(1, len(s["properties"])))
    if rng.random() < 0.1:
        s["nullable"] = True
    return s


def tools(rng):
    out = []
    for i in range(rng.randint(0, 3)):
        fn = {"name": rng.choice(["get_weather", "search", "calc", "noop"]) + str(i)}
        if rng.random() < 0.8:
            fn["description"] = text(rng, 1, 8)
        if rng.random() < 0.9:
            fn["parameters"] = schema(rng)
        out.append({"type": "function", "function": fn} if rng.random() < 0.97 else fn)
    return out


def content(rng, media=True):
    if rng.random() < 0.5:
        return text(rng)
    parts = []
    for _ in range(rng.randint(0, 4)):
        kind = rng.choice(["text", "text", "image", "audio", "video"] if media else ["text"])
        parts.append({"type": kind, "text": text(rng)} if kind == "text" else {"type": kind})
    return parts


def tool_call(rng):
    args = {f"a{i}": value(rng) for i in range(rng.randint(0, 3))}
    fn = {"name": rng.choice(["get_weather", "search", "calc"]), "arguments": json.dumps(args) if rng.random() < 0.3
          else args}
    return {"type": "function", "function": fn} if rng.random() < 0.9 else {"function": fn}


def conversation(rng):
    msgs = []
    if rng.random() < 0.4:
        msgs.append({"role": rng.choice(["system", "system", "developer"]), "content": content(rng, media=False)})
    for _ in range(rng.randint(1, 5)):
        r = rng.random()
        if r < 0.45:
            msgs.append({"role": "user", "content": content(rng)})
        elif r < 0.85:
            m = {"role": "assistant", "content": content(rng, media=False) if rng.random() < 0.8 else None}
            if rng.random() < 0.3:
                m[rng.choice(["reasoning", "reasoning_content"])] = text(rng, 1, 6)
            if rng.random() < 0.35:
                m["tool_calls"] = [tool_call(rng) for _ in range(rng.randint(1, 2))]
            if rng.random() < 0.15:
                m["tool_responses"] = [{"name": "get_weather", "response": value(rng)}
                                       for _ in range(rng.randint(1, 2))]
            if m["content"] is None and rng.random() < 0.5:
                del m["content"]
            msgs.append(m)
        else:
            m = {"role": "tool", "content": rng.choice([text(rng), json.dumps(value(rng))])}
            if rng.random() < 0.7:
                m["name"] = "get_weather"
            if rng.random() < 0.5:
                m["tool_call_id"] = "call_" + str(rng.randint(0, 9))
            msgs.append(m)
    line = {"messages": msgs, "add_generation_prompt": rng.random() < 0.6}
    if rng.random() < 0.5:
        line["tools"] = tools(rng)
    if rng.random() < 0.6:
        line["enable_thinking"] = rng.random() < 0.5
    return line


def render_jinja2(env, src, special, line):
    ctx = dict(special)
    ctx.update(messages=line["messages"], tools=line.get("tools"), documents=None,
               add_generation_prompt=line.get("add_generation_prompt", False))
    if "enable_thinking" in line:
        ctx["enable_thinking"] = line["enable_thinking"]
    try:
        return env.from_string(src).render(**ctx), None
    except Exception as e:  # noqa: BLE001 (any failure: both must fail)
        return None, f"{type(e).__name__}: {e}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "gemma4c"))
    ap.add_argument("--tokenizer-config", default=os.path.join(SHARED, "tokenizer", "tokenizer_config.json"))
    ap.add_argument("templates", nargs="*")
    args = ap.parse_args()
    templates = args.templates or sorted(glob.glob(os.path.join(SHARED, "chat_templates", "*.jinja")))
    cfg = json.load(open(args.tokenizer_config))
    special = {}
    for k in ("bos_token", "eos_token", "pad_token", "unk_token"):
        v = cfg.get(k)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            special[k] = v
    env = make_env()
    bad = 0
    for tpath in templates:
        src = open(tpath, encoding="utf-8").read()
        lines = [conversation(random.Random(args.seed * 1000003 + i)) for i in range(args.n)]
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
            for line in lines:
                f.write(json.dumps(line, ensure_ascii=False) + "\n")
            path = f.name
        res = subprocess.run([args.bin, "template", "--template", tpath, "--tokenizer-config", args.tokenizer_config,
                              "-f", path], capture_output=True, text=True)
        os.unlink(path)
        outs = [json.loads(x) for x in res.stdout.splitlines() if x.strip()]
        if len(outs) != len(lines):
            print(f"FAIL {tpath}: {len(outs)} output lines for {len(lines)}: {res.stderr.strip()[:300]}")
            bad += 1
            continue
        both_fail = agree = 0
        for i, (line, got) in enumerate(zip(lines, outs)):
            want, err = render_jinja2(env, src, special, line)
            got_err = isinstance(got, dict) and "error" in got
            if err is not None and got_err:
                both_fail += 1
                continue
            if err is None and not got_err and got == want:
                agree += 1
                continue
            bad += 1
            if bad <= 10:
                print(f"FAIL {os.path.basename(tpath)} conversation {i} (seed {args.seed}):\n  input  "
                      f"{json.dumps(line, ensure_ascii=False)[:1500]}\n  jinja2 {json.dumps(want)[:1500] if err is None else err}"
                      f"\n  gemma4c {json.dumps(got, ensure_ascii=False)[:1500]}")
        print(f"{os.path.basename(tpath)}: {agree} equal, {both_fail} refused by both, "
              f"{len(lines) - agree - both_fail} different")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
