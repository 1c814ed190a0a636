#!/usr/bin/env python3
"""Differential fuzzer: gemma4c's Jinja interpreter (src/jinja/) against jinja2 itself.

It generates random but syntactically valid templates from a grammar of the Jinja subset that chat
templates use (text and whitespace around tags with trim_blocks/lstrip_blocks, {%- -%} {{- -}}
{%+ control, literals, context variables, attribute/item access, slices, arithmetic, ~, chained
comparisons, and/or/not, in, `is` tests, inline if, filters, str/dict/list methods, set / block set /
tuple unpacking / namespace, for with else, `if` filters, loop.*, break/continue, if/elif/else,
macros with defaults, raw, comments), renders each with jinja2 in Hugging Face transformers'
chat-template environment (the one tests/data/make_jinja_cases.py uses) and with gemma4c
(build/tests/jinja-render, a dev-only program that renders JSON lines from stdin), and compares:
the outputs must be equal byte for byte, or both must fail.  Each mismatch is shrunk (tokens of the
template are removed while jinja2 still parses it and the same kind of mismatch holds) and printed.

Usage (from the repository root; needs jinja2, e.g. the pyenv python3, not /usr/bin/python3):
    cmake --build build --target jinja-render          # tests/tools/jinja_render.c
    python3 tests/data/jinja_diff.py [-n COUNT] [--seed SEED] [--bin build/tests/jinja-render]
                                     [--max-report N] [--show-ignored] [--unsupported] [--no-shrink]
    -n       templates to try (default 2000; about 5,000 a minute on one core when all agree)
    --seed   first seed; template i uses seed+i, so a run is reproducible and any template can be
             re-made alone with  --seed S -n 1  (the report prints S)
    --unsupported  also generate features gemma4c documents as unsupported (str.format, the
             filters it lacks): they show as the ignored class 'unsupported'
    --no-shrink  print mismatches as generated
Exit status 1 when a mismatch that is not in an ignored class was found.  A real divergence that
gets fixed goes into tests/data/make_jinja_cases.py's CASES (section "found by the differential
fuzzer"), so that test_jinja replays it without jinja2 (CI has none).

Differences ignored, by design (counted and, with --show-ignored, listed):
  - both fail: the error messages are not compared (wording differs; gemma4c names the line).
  - 'repr-objects': jinja2 prints an object gemma4c has no counterpart for, or prints it as a
    list: dict_items([...]) / dict_keys / dict_values, range(...), <generator object ...>,
    <function ...>, <bound method ...>, <built-in method ...>, <Macro ...>, Markup('...') (the
    escape filter's result inside a printed list or dict; gemma4c has plain strings), Namespace repr,
    Undefined repr, <jinja2.runtime.LoopContext ...> and similar.  Printing them is no use in a
    chat template, and gemma4c documents the list form (jinja.h, "Known differences").
  - 'lazy': gemma4c fails where jinja2 renders, and the template applies a lazy filter (map, select,
    reject, selectattr, rejectattr, unique, reverse on a list, items, batch, slice) whose generator
    jinja2 never consumed: gemma4c runs them at once (documented in jinja.h).
  - 'unsupported': gemma4c fails on a feature that jinja.h lists as not supported (str.format,
    filters it does not have, call blocks, ...).  Only generated with --unsupported.
  - 'unknown-name': jinja2 refuses a filter or test it does not know when compiling; gemma4c fails
    only when the template reaches it (documented in jinja.h), so a branch never taken renders.
  - 'limits': gemma4c stops at its step/output/memory limits, or at 64-bit integer overflow
    (documented: no integers beyond 64 bits), where jinja2 (no limits, big ints) renders.
  - 'const-slice': a slice of a constant that is no sequence (({})[:], (false)[:]): jinja2 folds
    the constant at compile time, its getitem swallows the TypeError and gives Undefined; gemma4c
    fails, as jinja2 itself does for the same value from a variable (documented in jinja.h).
  - 'shadow-scope': the template sets a name that is also a context variable, and the two agree
    once the context lacks it: jinja2 decides per frame, from the order of a name's first uses,
    that a read (in a loop, block set body or macro, ahead of the top level's assignment) is of
    the not yet assigned variable (undefined); gemma4c reads the context variable (documented
    in jinja.h).
  - 'markup': jinja2's safe and escape filters return Markup strings, which escape what + and %
    join to them (Markup('a') + "'" is "a&#39;") and fail as %d arguments; gemma4c returns plain
    strings (documented in jinja.h).  Decided by rendering again with jinja2 whose safe/escape
    return plain strings: if gemma4c agrees with that, the difference is this one.
  - 'complex': a negative number raised to a fractional power is a complex number in Python;
    gemma4c has no complex numbers and fails.
"""
import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import warnings

import jinja2
import markupsafe
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


warnings.simplefilter("ignore")  # SyntaxWarnings of the Python code jinja2 compiles ('3[1:]')
ENV = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
ENV.filters["tojson"] = tojson
ENV.globals["raise_exception"] = raise_exception

# the same environment with Markup-free safe/escape (plain strings), to tell the 'markup' class apart
ENV_PLAIN = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
ENV_PLAIN.filters["tojson"] = tojson
ENV_PLAIN.globals["raise_exception"] = raise_exception
ENV_PLAIN.filters["safe"] = lambda v: str(v)
ENV_PLAIN.filters["e"] = ENV_PLAIN.filters["escape"] = lambda v: str(markupsafe.escape(v))

CTX = {
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Héllo wörld 👋 \"quoted\" and 'single'\n  second line  "},
        {"role": "assistant", "content": " <think>hmm</think>\nThe answer is 42. ",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                           "arguments": {"city": "Paris", "days": 3}}}]},
        {"role": "tool", "name": "get_weather", "content": "{\"temp\": 21.5}"},
        {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image"}]},
    ],
    "tools": [
        {"type": "function", "function": {"name": "get_weather", "description": "Get the weather.",
                                          "parameters": {"type": "object",
                                                         "properties": {"city": {"type": "string"},
                                                                        "days": {"type": "integer"}},
                                                         "required": ["city"]}}},
        {"type": "function", "function": {"name": "search", "description": "Search the web",
                                          "parameters": {"type": "object", "properties": {}}}},
    ],
    "bos_token": "<bos>", "eos_token": "<eos>", "add_generation_prompt": True, "enable_thinking": False,
    "nums": [3, -1, 2.5, 0, 7, 10], "ints": [4, 1, 3, 1, 2], "words": ["banana", "Apple", "cherry", "apple", ""],
    "s": "  Hello, World!  ", "u": "ünïcödé ß ΣΑΣ 中文 ǆ", "empty": "", "n": None, "t": True, "f": False,
    "i": 42, "neg": -7, "x": -3.75, "d": {"b": 2, "a": 1, "C": 3}, "sd": {"role": "user", "name": "Bob"},
    "nested": {"a": {"b": [1, {"c": "deep"}], "e": []}}, "csv": "a,b,,c", "ml": "line1\nline2\r\n\n line4 ",
}

# ----------------------------------------------------------------------------------------------
# the grammar


def kind_of(v):
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "num"
    if isinstance(v, str):
        return "str"
    if isinstance(v, list):
        return "list"
    if isinstance(v, dict):
        return "dict"
    return "any"


def context_paths(ctx):
    """(expression, value) for every context value reachable in at most 3 steps, with random
    attribute/item syntax chosen later."""
    out = []

    def walk(expr_parts, v, depth):
        out.append((expr_parts, v))
        if depth == 3:
            return
        if isinstance(v, dict):
            for k, w in v.items():
                walk(expr_parts + [("key", k)], w, depth + 1)
        elif isinstance(v, list):
            for j, w in enumerate(v[:3]):
                walk(expr_parts + [("idx", j if j % 2 == 0 else j - len(v))], w, depth + 1)

    for k, v in ctx.items():
        walk([("name", k)], v, 0)
    return out


PATHS = context_paths(CTX)
PATHS_BY_KIND = {}
for _p, _v in PATHS:
    PATHS_BY_KIND.setdefault(kind_of(_v), []).append((_p, _v))

STR_PIECES = ["a", "b", "ab", "Hello", "world", " ", "  x  ", "", ",", ", ", "-", "\\n", "\\t", "é", "ß", "Σ",
              "中文", "👋", "\\'", '\\"', "\\\\", "<think>", "</think>", "user", "assistant", "role", "A b C",
              "x-y_z", "1", "42", "3.5", " 7 ", "\\u00e9", "\\x41", "ǆ", "İ", "ﬁ", "a,b", "%", "{", "}"]
TEXTS = ["", "", " ", "  ", "\n", "\n", "\n  ", " \n", "  \n  ", "\t", "x", "a b\n", "\n\n", "<tag>", "é ",
         "line\n    ", "  text  ", "\r\n"]
DICT_KEYS = ["a", "b", "role", "content", "name", "k", "B", "é", "1"]


class Gen:
    def __init__(self, rng, unsupported=False):
        self.rng = rng
        self.unsupported = unsupported
        self.scope = []  # (name, kind, sample) of variables set or bound by loops/macros
        self.in_loop = 0
        self.macros = []  # (name, n_required, params)
        self.depth = 0
        self.ns = []  # namespace variable names

    def chance(self, p):
        return self.rng.random() < p

    def pick(self, xs):
        return self.rng.choice(xs)

    # ---------------------------------------------------------------- literals
    def lit_str(self):
        r = self.rng
        body = "".join(r.choice(STR_PIECES) for _ in range(r.randint(0, 3)))
        q = "'" if r.random() < 0.7 else '"'
        if q == "'":
            body = re.sub(r"(?<!\\)'", "\\'", body)
        else:
            body = re.sub(r'(?<!\\)"', '\\"', body)
        return q + body + q

    def lit_int(self):
        r = self.rng
        v = r.choice([0, 1, 2, 3, -1, -2, 5, 7, 10, 12, 100, -15, 255, 1000000])
        if r.random() < 0.05:
            return r.choice(["0x1F", "0o17", "0b101", "1_000"])
        return str(v)

    def lit_num(self):
        r = self.rng
        if r.random() < 0.4:
            return self.lit_int()
        return r.choice(["1.5", "-0.25", "0.1", "2.0", "1e3", "2.5e-2", "-1.5E2", "3.14159", "0.0", "-0.0",
                         "1e16", "1e-5", "100.0", "0.5", "1.0e1", "7.25"])

    def lit_bool(self):
        return self.pick(["true", "false", "True", "False"])

    def lit_none(self):
        return self.pick(["none", "None"])

    # ---------------------------------------------------------------- variables
    def path_expr(self, parts):
        out = ""
        for kind, k in parts:
            if kind == "name":
                out = k
            elif kind == "idx":
                out += "[%d]" % k if self.chance(0.85) else ".%d" % k if k >= 0 else "[%d]" % k
            else:
                if re.fullmatch(r"[A-Za-z_]\w*", k) and k not in ("items", "keys", "values", "get") \
                        and self.chance(0.5):
                    out += "." + k
                else:
                    out += "[%s]" % repr(k)
        return out

    def var_of(self, kind):
        cands = [(n, k, s) for n, k, s in self.scope if k == kind or kind == "any"]
        if cands and self.chance(0.6):
            n, k, s = self.pick(cands)
            if isinstance(s, dict) and s and self.chance(0.3) and kind == "any":
                key = self.pick(list(s.keys()))
                return n + ("." + key if self.chance(0.5) else "[%r]" % key)
            return n
        if kind == "any":
            parts, _ = self.pick(PATHS)
        else:
            opts = PATHS_BY_KIND.get(kind) or PATHS_BY_KIND.get("num" if kind == "int" else "str")
            parts, _ = self.pick(opts)
        return self.path_expr(parts)

    # ---------------------------------------------------------------- expressions
    def expr(self, kind="any"):
        self.depth += 1
        try:
            if self.depth > 4:
                return self.leaf(kind)
            if kind == "any":
                kind = self.pick(["str", "str", "int", "num", "list", "dict", "bool", "any_leaf"])
                if kind == "any_leaf":
                    return self.leaf("any")
            if self.chance(0.03):  # deliberately ill-typed now and then
                kind = self.pick(["str", "int", "list", "dict", "bool"])
            e = getattr(self, "e_" + kind)()
            # an operand `not x` after a comparison or arithmetic operator is, in jinja2, the
            # variable `not` (its operands are parsed below `not`): a quirk no template relies on
            return self.paren(e) if e.startswith("not ") and self.depth > 1 else e
        finally:
            self.depth -= 1

    def leaf(self, kind):
        if kind == "any":
            kind = self.pick(["str", "int", "num", "list", "dict", "bool", "none"])
        if kind == "none":
            return self.lit_none() if self.chance(0.6) else self.pick(["n", "nope", "messages[0].nope"])
        if self.chance(0.5):
            return self.var_of(kind)
        return {"str": self.lit_str, "int": self.lit_int, "num": self.lit_num, "bool": self.lit_bool,
                "list": lambda: "[%s]" % ", ".join(self.lit_int() for _ in range(self.rng.randint(0, 3))),
                "dict": lambda: "{%s}" % ", ".join("%r: %s" % (self.pick(DICT_KEYS), self.lit_int())
                                                   for _ in range(self.rng.randint(0, 2)))}[kind]()

    def paren(self, e):
        return "(" + e + ")"

    def e_str(self):
        r = self.rng.random
        c = self.rng.randint(0, 29)
        E = self.expr
        if c <= 3:
            return self.leaf("str")
        if c == 4:
            return "%s ~ %s" % (E("any"), E("any"))
        if c == 5:
            return "%s + %s" % (E("str"), E("str"))
        if c == 6:
            f = self.pick(["trim", "upper", "lower", "title", "capitalize", "string", "e", "reverse",
                           "trim('x ')", "replace(%s, %s)" % (self.lit_str(), self.lit_str()),
                           "replace('l', 'L', 1)", "center(%d)" % self.pick([0, 5, 10, 11]),
                           "indent(%d)" % self.pick([1, 2, 4]), "indent(2, true)", "indent(2, first=true, blank=true)",
                           "default('dflt')", "d('x', true)", "default(none, false)", "first", "last",
                           "string|upper", "truncate(%d)" % self.pick([3, 5, 9, 20]), "truncate(8, true)",
                           "truncate(6, false, '…', 0)", "truncate(4, leeway=1, end='')"])
            base = E("str")
            if f in ("first", "last"):
                base = E("str")
            return "%s|%s" % (self.paren(base) if r() < 0.3 else base, f)
        if c == 7:
            m = self.pick(["strip()", "lstrip()", "rstrip()", "strip(%s)" % self.lit_str(), "lstrip('< ')",
                           "rstrip('\\n ')", "upper()", "lower()", "title()", "capitalize()",
                           "replace(%s, %s)" % (self.lit_str(), self.lit_str()), "replace('a', 'b', 1)",
                           "removeprefix('He')", "removesuffix(' ')"])
            return "%s.%s" % (self.paren(E("str")), m)
        if c == 8:
            return "%s.join(%s)" % (self.lit_str(), E("list") if r() < 0.3 else self.str_list())
        if c == 9:
            return "%s|join(%s)" % (self.str_list() if r() < 0.7 else E("list"),
                                     self.pick(["", "', '", "'-'", "''", "'\\n'"]))
        if c == 10:
            return "(%s if %s else %s)" % (E("str"), E("bool"), E("str"))
        if c == 11:
            return "%s|tojson%s" % (E("any"), self.pick(["", "", "(indent=2)", "(indent=1)", "(sort_keys=true)",
                                                         "(ensure_ascii=true)", "(separators=(',', ':'))"]))
        if c == 12:
            return "%s[%s]" % (self.paren(E("str")), self.slice_())
        if c == 13:
            return "%s[%d]" % (self.var_of("str"), self.pick([0, 1, -1, -2]))
        if c == 14:
            return "%s|string" % E("any")
        if c == 15 and self.macros:
            return self.macro_call()
        if c == 16:
            return "%s|%s" % (self.str_list(), self.pick(["first", "last", "join", "join(' ')", "sort|join(',')",
                                                         "max", "min", "unique|join"]))
        if c == 17:
            return "%s.split(%s)[%d]" % (self.paren(E("str")), self.pick(["", "','", "' '", "'\\n'", "None, 1"]),
                                          self.pick([0, -1]))
        if c == 18:
            f = self.pick(["%s", "%s", "%r", "[%s]", "%-4s|", "%d", "%5.2f", "%03d", "%x", "%%"])
            arg = E("int" if f[-1] in "dfx" else "any")
            return "'%s' %% %s" % (f, "()" if f == "%%" else "(%s, )" % arg if r() < 0.7 else self.paren(arg))
        if c == 19:
            return "%s|format(%s)" % (self.pick(["'%s-%s'", "'%d'", "'%s'"]), ", ".join(E("any") for _ in range(2)))
        if c == 20:
            return "%s|dictsort|first|first" % self.var_of("dict")
        if c == 21:
            return "%s.get(%s, %s)" % (self.var_of("dict"), self.pick(["'role'", "'a'", "'zz'", "'content'"]),
                                       self.lit_str())
        if c == 22:
            return "%s|%s" % (self.var_of("list"), self.pick(["tojson", "string", "join('|')", "first|string"]))
        if c == 23:
            return "%s|wordcount|string" % E("str")
        if c == 24 and self.unsupported:
            return self.pick(["'{} and {}'.format(%s, %s)" % (E("any"), E("any")),
                              "%s|wordwrap(5)" % E("str"), "%s|striptags" % E("str"),
                              "%s|urlencode" % E("str"), "%s|filesizeformat" % E("int"),
                              "%s|pprint" % E("any"), "%s|xmlattr" % E("dict"),
                              "%s|forceescape" % E("str"), "'{name}'.format(name=%s)" % E("str")])
        if c == 25:
            return "%s|%s" % (E("any"), self.pick(["default('d')", "d", "default(%s, true)" % self.lit_str()]))
        if c == 27:
            return self.pick(["'%(role)s: %(name)s' % sd", "'%(a)d-%(b)05.1f' % d", "'%s and %s' % ('x', i)",
                              "'%-6s|%6s' % ('ab', 'cd')", "'%c%c' % (72, 'i')", "'%.2e %g %G' % (x, 1e-5, 1e20)",
                              "'%+d % d %o %X %#x' % (i, i, i, 255, 255)", "'%5.1f%%' % 12.345",
                              "%s|max(attribute='n')|string" % "[{'n': 2}, {'n': 5}]",
                              "messages|min(attribute='role')|tojson",
                              "%s|string" % self.pick(["'inf'|float", "'nan'|float", "'-inf'|float", "'1e400'|float",
                                                       "' -3 '|int", "'0x1A'|int(0, 16)", "'0b11'|int(base=0)",
                                                       "'1_000'|int", "'12.5e1'|float", "'１２'|int"]),
                              "%s|join(attribute='role')" % self.pick(["messages", "[{'role': 1}, {'role': 'x'}]"]),
                              "%s|sum(attribute='n')|string" % "[{'n': 2}, {'n': 5.5}]",
                              "'ab'|center(1)", "'ab'|center(7)|replace(' ', '.')", "'é'|center(4)|tojson"])
        if c == 26:
            return "%s[%s]" % (self.pick(["'abcdef'", "s", "u", "'héllo wörld'"]), self.slice_())
        if c == 28:
            return self.pick(["%s|safe" % E("str"), "raise_exception(%s)" % self.lit_str(),
                              "%s.append(1)|string" % self.pick(["ints", "[]", "ns.l" if self.ns else "words"]),
                              "%s|items|map('join', '=')|join(';')" % self.pick(["sd", "d", "{'a': 'b'}"]),
                              "tools[0].function.parameters.properties|items|map('first')|join(',')",
                              "messages[-1].content[0].text", "(messages[-1].content|selectattr('type', 'eq', 'text')"
                              "|map(attribute='text')|join)"])
        return self.leaf("str")

    def str_list(self):
        return self.pick(["words", "['b', 'a', 'C']", "messages|map(attribute='role')",
                          "%s.split(%s)" % (self.pick(["csv", "s", "ml", "u", "'a b  c'"]),
                                            self.pick(["", "','", "' '", "None, 1", "',', 1", "'\\n'"])),
                          "[%s, %s]" % (self.lit_str(), self.lit_str()), "d|list", "sd.values()|list",
                          "tools|map(attribute='function')|map(attribute='name')", "ml.splitlines()",
                          "s.rsplit(',', 1)", "words|select|map('upper')", "words|reject('eq', 'apple')"])

    def slice_(self):
        a = self.pick(["", "1", "-1", "2", "-3", "0", "10"])
        b = self.pick(["", "3", "-1", "-2", "1", "100"])
        if self.chance(0.5):
            return "%s:%s" % (a, b)
        return "%s:%s:%s" % (a, b, self.pick(["", "-1", "2", "-2", "3"]))

    def e_int(self):
        c = self.rng.randint(0, 17)
        E = self.expr
        if c <= 2:
            return self.leaf("int")
        if c == 3:
            return "%s %s %s" % (E("int"), self.pick(["+", "-", "*", "//", "%"]), E("int"))
        if c == 4:
            return "%s|%s" % (E("any"), self.pick(["length", "count"]))
        if c == 5:
            return "%s|int" % E("any")
        if c == 6:
            return "%s.%s(%s)" % (self.paren(E("str")), self.pick(["find", "count", "rfind"]), self.lit_str())
        if c == 7:
            return "%s|abs" % E("num")
        if c == 8:
            return "loop.%s" % self.pick(["index", "index0", "revindex", "revindex0", "length", "depth"]) \
                if self.in_loop else self.leaf("int")
        if c == 9:
            return "%s|sum" % self.pick(["ints", "[1, 2, 3]", "nums|select('number')", "range(%d)" % self.rng.randint(0, 5)])
        if c == 10:
            return "%s ** %s" % (self.pick(["2", "3", "-2", "10", "i"]), self.pick(["0", "1", "2", "3"]))
        if c == 11:
            return "%s|%s" % (self.pick(["ints", "nums", "[3, -1, 2]"]), self.pick(["max", "min", "first", "last"]))
        if c == 12:
            return "%s|wordcount" % E("str")
        if c == 13:
            return "%s|round|int" % E("num")
        if c == 14:
            return "-%s" % self.paren(E("int"))
        if c == 15:
            return "%s.index(%s)" % (self.pick(["ints", "[1, 2, 3]", "words"]), self.pick(["1", "3", "'apple'"]))
        if c == 16:
            return "%s.count(%s)" % (self.pick(["ints", "words"]), self.pick(["1", "'apple'"]))
        return self.leaf("int")

    def e_num(self):
        c = self.rng.randint(0, 9)
        E = self.expr
        if c <= 2:
            return self.leaf("num")
        if c == 3:
            return "%s %s %s" % (E("num"), self.pick(["+", "-", "*", "/", "//", "%"]), E("num"))
        if c == 4:
            return "%s|float" % E("any")
        if c == 5:
            return "%s|round%s" % (E("num"), self.pick(["", "(1)", "(2)", "(0, 'floor')", "(1, 'ceil')", "(2, 'common')",
                                                               "(-1)", "(-2, 'floor')"]))
        if c == 6:
            return "%s ** %s" % (self.pick(["2.0", "0.5", "4", "-8.0", "x"]), self.pick(["2", "0.5", "-1", "3"]))
        if c == 7:
            return "%s / %s" % (E("int"), self.pick(["2", "3", "4", "0.5", "7"]))
        if c == 8:
            return "%s|abs" % E("num")
        return self.e_int()

    def e_bool(self):
        c = self.rng.randint(0, 16)
        E = self.expr
        if c <= 1:
            return self.leaf("bool")
        if c == 2:
            k = self.pick(["int", "num", "str"])
            ops = ["==", "!=", "<", ">", "<=", ">="]
            e = "%s %s %s" % (E(k), self.pick(ops), E(k))
            if self.chance(0.3):
                e += " %s %s" % (self.pick(ops), E(k))
            return e
        if c == 3:
            return "%s %s %s" % (E("bool"), self.pick(["and", "or"]), E("any" if self.chance(0.3) else "bool"))
        if c == 4:
            return "not %s" % E("any")
        if c == 5:
            return "%s %s %s" % (E("str"), self.pick(["in", "not in"]), E("str"))
        if c == 6:
            return "%s %s %s" % (E("any"), self.pick(["in", "not in"]), self.pick([E("list"), self.var_of("dict"),
                                                                                 "['a', 1, none]"]))
        if c in (7, 8, 9):
            return self.e_test()
        if c == 10:
            return "%s.%s(%s)" % (self.paren(E("str")), self.pick(["startswith", "endswith"]),
                                  self.lit_str() if self.chance(0.8) else "(%s, %s)" % (self.lit_str(), self.lit_str()))
        if c == 11:
            return "%s.%s()" % (self.paren(E("str")), self.pick(["isdigit", "isalpha", "isalnum", "isspace",
                                                                 "isupper", "islower"]))
        if c == 12:
            return "loop.%s" % self.pick(["first", "last"]) if self.in_loop else self.leaf("bool")
        if c == 13:
            return "%s == %s" % (E("any"), E("any"))
        if c == 14:
            return "%s|length > %d" % (E(self.pick(["str", "list"])), self.pick([0, 1, 3]))
        return E("any") if self.chance(0.5) else self.leaf("bool")

    def e_test(self):
        E = self.expr
        neg = " not" if self.chance(0.25) else ""
        t = self.pick(["defined", "undefined", "none", "string", "number", "integer", "float", "mapping",
                       "iterable", "sequence", "boolean", "true", "false", "callable", "lower", "upper",
                       "even", "odd", "divisibleby(3)", "divisibleby 2", "eq(1)", "ne 'a'", "lt(3)", "gt 0",
                       "le(2.5)", "ge(-1)", "equalto 'user'", "greaterthan 1", "lessthan(5)",
                       "in(['a', 'user', 1])", "in 'abc'", "sameas(none)", "sameas true", "filter", "test",
                       "escaped"])
        if t in ("even", "odd") or t.startswith("divisibleby"):
            subj = E("int")
        elif t in ("lower", "upper"):
            subj = E("str")
        elif t in ("filter", "test"):
            subj = self.pick(["'upper'", "'odd'", "'nosuch'", "'length'", "'defined'"])
        elif t.startswith(("lt", "gt", "le", "ge", "less", "greater")):
            subj = E("num")
        else:
            subj = E("any")
        if any(op in subj for op in (" if ", " and ", " or ", "not ", "~", "+", "-", "*", "/", "%", "<", ">", "=",
                                      " in ", " is ")) or "|" in subj and self.chance(0.5):
            subj = self.paren(subj)
        return "%s is%s %s" % (subj, neg, t)

    def e_list(self):
        c = self.rng.randint(0, 20)
        E = self.expr
        if c <= 2:
            return self.leaf("list")
        if c == 3:
            return "[%s]" % ", ".join(E("any") for _ in range(self.rng.randint(0, 3)))
        if c == 4:
            return "(%s)" % "".join(E("any") + ", " for _ in range(self.rng.randint(1, 3)))
        if c == 5:
            return "%s[%s]" % (self.paren(E("list")), self.slice_())
        if c == 6:
            return "%s|%s" % (self.pick(["ints", "nums", "words", "[3, 1, 2]", "['b', 'A', 'a']"]),
                              self.pick(["sort", "sort(reverse=true)", "sort(case_sensitive=true)",
                                         "unique|list", "unique(case_sensitive=true)|list", "reverse|list", "list",
                                         "select('odd')|list", "reject('odd')|list", "select('gt', 1)|list",
                                         "select('number')|list", "reject('string')|list", "map('string')|list",
                                         "map('abs')|list", "map('upper')|list", "batch(2)|list",
                                         "batch(2, 'x')|list", "slice(2)|list", "sort|reverse|list",
                                         "select|list", "map('int')|list", "map('round', 1)|list",
                                         "map('default', 'x')|list", "select('in', [1, 'apple', 3])|list",
                                         "reject('none')|list", "reject('undefined')|list", "map('string')|map('trim')|list",
                                         "map('string')|map('replace', '1', 'one')|list", "select('ne', 1)|list",
                                         "select('divisibleby', 2)|list", "select('string')|map('length')|list",
                                         "unique(case_sensitive=false)|list", "reject('lower')|list"]))
        if c == 7:
            return "%s|%s" % (self.pick(["messages", "tools", "[{'n': 2, 'v': 'b'}, {'n': 1, 'v': 'a'}, {'n': 3}]"]),
                              self.pick(["map(attribute='role')|list", "selectattr('role', 'equalto', 'user')|list",
                                         "rejectattr('role', 'eq', 'user')|list", "selectattr('tool_calls')|list",
                                         "selectattr('content', 'string')|list", "rejectattr('name', 'defined')|list",
                                         "map(attribute='function.name')|list", "map(attribute='n', default=0)|list",
                                         "sort(attribute='role')", "sort(attribute='n')", "sort(attribute='v', reverse=true)",
                                         "map(attribute='v')|list", "selectattr('n', 'gt', 1)|list",
                                         "map(attribute='role')|unique|list",
                                         "sort(attribute='function.name', reverse=true)|map(attribute='type')|list",
                                         "sort(attribute='role,content')", "sort(attribute='v,n', reverse=true)",
                                         "map(attribute='n', default=none)|list", "map(attribute='function.name')|list",
                                         "map(attribute='tool_calls.0.function.name', default='-')|list",
                                         "selectattr('role', 'in', ['user', 'tool'])|list", "unique(attribute='role')|list",
                                         "rejectattr('content', 'string')|map(attribute='role')|list",
                                         "selectattr('n', 'defined')|map(attribute='n')|list", "rejectattr('tool_calls')|list"]))
        if c == 8:
            return "%s|%s" % (self.pick(["d", "sd", "nested.a", "{'b': 1, 'a': 2}", "{'B': 1, 'a': 2, 'c': 0}"]),
                              self.pick(["items|list", "dictsort", "dictsort(by='value')", "dictsort(reverse=true)",
                                         "dictsort(true)", "list", "dictsort|map('first')|list", "sort"]))
        if c == 9:
            return "%s.%s()|list" % (self.var_of("dict"), self.pick(["items", "keys", "values"]))
        if c == 10:
            return "%s.%s(%s)" % (self.paren(E("str")), self.pick(["split", "rsplit"]),
                                  self.pick(["", "','", "' '", "None, 1", "',', 1", "'l'", "maxsplit=1"]))
        if c == 11:
            return "range(%s)|list" % self.pick(["3", "0", "1, 4", "5, 0, -2", "-2", "2, 10, 3"])
        if c == 12:
            return "%s + %s" % (E("list"), E("list"))
        if c == 13:
            return "%s|list" % E("str")
        if c == 14:
            return "%s * %d" % (self.pick(["[1, 2]", "['a']", "ints"]), self.pick([0, 1, 2, -1]))
        if c == 15:
            return "%s.splitlines()" % self.pick(["ml", "s", "'a\\nb\\r\\nc\\n'", "''"])
        if c == 16:
            return self.pick(["messages[1:]", "messages[:-1]", "messages[::-1]|map(attribute='role')|list",
                              "messages[-2:]", "tools[::2]"])
        if c == 17:
            return "%s|batch(%d)|list" % (E("list"), self.pick([1, 2, 3])) if self.chance(0.5) else \
                "%s|slice(%d)|list" % (E("list"), self.pick([1, 2, 3]))
        return self.leaf("list")

    def e_dict(self):
        c = self.rng.randint(0, 6)
        E = self.expr
        if c <= 2:
            return self.leaf("dict")
        if c == 3:
            return "{%s}" % ", ".join("%s: %s" % (self.pick(["'a'", "'b'", "'role'", "'é'", "1", "'k'"]), E("any"))
                                      for _ in range(self.rng.randint(0, 3)))
        if c == 4:
            keys = self.rng.sample(["a", "b", "role", "k"], self.rng.randint(0, 2))
            return "dict(%s)" % ", ".join("%s=%s" % (k, E("any")) for k in keys)
        if c == 5:
            return "%s|%s" % (self.var_of("list"), self.pick(["first", "last"]))
        return self.leaf("dict")

    def macro_call(self):
        name, nreq, params = self.pick(self.macros)
        args = [self.expr("any") for _ in range(nreq)]
        if len(params) > nreq and self.chance(0.5):
            p = self.pick(params[nreq:])
            args.append("%s=%s" % (p, self.expr("any")))
        return "%s(%s)" % (name, ", ".join(args))

    # ---------------------------------------------------------------- statements
    def tag(self, body):
        l = self.pick(["", "", "", "-", "+"])
        r = self.pick(["", "", "", "-", "+"])
        return "{%" + l + " " + body + " " + r + "%}"

    def out(self, e):
        l = self.pick(["", "", "-"])
        r = self.pick(["", "", "-"])
        return "{{" + l + " " + e + " " + r + "}}"

    def text(self):
        return self.pick(TEXTS)

    def new_name(self):
        return self.pick(["v", "w", "tmp", "out", "content", "role", "acc", "y", "s", "i", "first"]) + \
            self.pick(["", "", "2", "_x"])

    def block(self, n, depth):
        return "".join(self.stmt(depth) for _ in range(n))

    def stmt(self, depth):
        c = self.rng.randint(0, 21)
        t = self.text()
        if depth > 3:
            c = self.pick([0, 1, 2])
        if c <= 3:
            return t + self.out(self.expr("any"))
        if c == 4:
            return t + self.pick(["{# comment #}", "{#- c -#}", "{# multi\nline #}", "{#- x #}", "{# {{ y }} #}"])
        if c == 5:
            return t + "{%" + self.pick(["", "-", "+"]) + " raw " + self.pick(["", "-"]) + "%}" + \
                self.pick(["{{ x }}", " {% if %} ", "\n  a\n", "{# #}"]) + self.tag("endraw")
        if c in (6, 7, 8):
            s = t + self.tag("if " + self.expr("bool")) + self.block(self.rng.randint(1, 2), depth + 1)
            for _ in range(self.rng.randint(0, 2)):
                s += self.text() + self.tag("elif " + self.expr("bool")) + self.block(1, depth + 1)
            if self.chance(0.5):
                s += self.text() + self.tag("else") + self.block(1, depth + 1)
            return s + self.text() + self.tag("endif")
        if c in (9, 10, 11):
            return t + self.for_stmt(depth)
        if c in (12, 13):
            name = self.new_name()
            kind = self.pick(["str", "int", "list", "bool", "any"])
            s = t + self.tag("set %s = %s" % (name, self.expr(kind)))
            self.scope.append((name, kind, None))
            return s
        if c == 14:
            # not a context name: jinja2's block set body sees its own target as undefined when
            # the frame has not referenced the name before (symbol analysis gemma4c does not do;
            # documented in jinja.h), so `{% set s %}{{ s }}{% endset %}` would differ
            name = self.new_name()
            while name in CTX:
                name = self.new_name()
            saved, saved_ns = list(self.scope), list(self.ns)
            s = t + self.tag("set %s%s" % (name, self.pick(["", "", "|trim", "|upper", "|length|string"]))) + \
                self.block(self.rng.randint(1, 2), depth + 1) + self.text() + self.tag("endset")
            self.scope, self.ns = saved, saved_ns
            self.scope.append((name, "str", None))
            return s
        if c == 15:
            a, b = self.new_name(), self.new_name()
            rhs = self.pick(["1, 2", "'x', 'y'", "[1, 'a']", "(none, true)", "'ab'", "d|dictsort|first",
                             "%s, %s" % (self.expr("any"), self.expr("any"))])
            s = t + self.tag("set %s, %s = %s" % (a, b, rhs))
            self.scope += [(a, "any", None), (b, "any", None)]
            return s
        if c == 16:
            ns = "ns%d" % len(self.ns)
            self.ns.append(ns)
            s = t + self.tag("set %s = namespace(%s)" % (ns, self.pick(["", "a=1", "a=0, b='x'", "found=false"])))
            s += self.text() + self.tag("set %s.a = %s" % (ns, self.expr("any")))
            return s + self.text() + self.out(ns + ".a")
        if c == 17 and self.ns:
            ns = self.pick(self.ns)
            return t + self.tag("set %s.%s = %s" % (ns, self.pick(["a", "b", "found"]), self.expr("any"))) + \
                self.out("%s.%s" % (ns, self.pick(["a", "b", "found"])))
        if c == 18 and self.in_loop:
            return t + self.tag("if %s" % self.expr("bool")) + self.tag(self.pick(["break", "continue"])) + \
                self.tag("endif")
        if c == 19 and self.macros:
            return t + self.out(self.macro_call())
        if c == 20:
            name = self.new_name()
            saved, saved_ns = list(self.scope), list(self.ns)
            self.scope.append((name, "any", None))
            body = self.block(self.rng.randint(1, 2), depth + 1)
            self.scope, self.ns = saved, saved_ns
            return t + self.tag("with %s = %s" % (name, self.expr("any"))) + body + self.text() + self.tag("endwith")
        if c == 21:
            saved, saved_ns = list(self.scope), list(self.ns)
            body = self.block(self.rng.randint(1, 2), depth + 1)
            self.scope, self.ns = saved, saved_ns
            return t + self.tag("filter %s" % self.pick(["upper", "trim", "lower|replace('a', 'A')", "indent(2)",
                                                        "center(30)", "title", "capitalize", "wordcount|string"])) + \
                body + self.text() + self.tag("endfilter")
        return t + self.out(self.expr("any"))

    def for_stmt(self, depth):
        it_kind = self.rng.randint(0, 9)
        if it_kind <= 3:
            src, var, sample = self.pick([("messages", "message", CTX["messages"][2]), ("tools", "tool", CTX["tools"][0]),
                                          ("messages[1:]", "m", CTX["messages"][1]),
                                          ("messages|selectattr('role', 'eq', 'user')", "m", CTX["messages"][1])])
            vars_ = [(var, "dict", sample)]
            target = var
        elif it_kind <= 5:
            src = self.pick(["d|dictsort", "d.items()", "sd|items", "{'a': 1, 'b': [2]}.items()",
                             "nested.a|dictsort"])
            k, v = self.pick([("k", "v"), ("key", "value"), ("name", "val")])
            vars_ = [(k, "str", None), (v, "any", None)]
            target = "%s, %s" % (k, v)
        else:
            src = self.expr(self.pick(["list", "list", "str"])) if self.chance(0.5) else \
                self.pick(["ints", "words", "nums", "range(%d)" % self.rng.randint(0, 4), "'abc'", "[]", "u", "n"])
            var = self.pick(["x", "item", "c", "i"])
            vars_ = [(var, "any", None)]
            target = var
        if " if " in src:
            src = self.paren(src)
        head = "for %s in %s" % (target, src)
        if self.chance(0.25):
            self.scope += vars_
            head += " if " + self.expr("bool")
            self.scope = self.scope[:-len(vars_)]
        saved, saved_ns = list(self.scope), list(self.ns)
        self.scope += vars_
        self.in_loop += 1
        body = self.block(self.rng.randint(1, 3), depth + 1)
        if self.chance(0.3):
            body += self.out(self.pick(["loop.index", "loop.index0", "loop.first", "loop.last", "loop.length",
                                        "loop.revindex", "loop.revindex0", "loop.previtem", "loop.nextitem",
                                        "loop.cycle('odd', 'even')", "loop.depth", "loop.depth0"]))
        self.in_loop -= 1
        self.scope, self.ns = saved, saved_ns
        s = self.tag(head) + body
        if self.chance(0.25):
            s += self.text() + self.tag("else") + self.block(1, depth + 1)
        return s + self.text() + self.tag("endfor")

    def macro_def(self):
        name = "m%d" % len(self.macros)
        params = self.pick([["a"], ["a", "b"], ["a", "b", "c"], []])
        nreq = self.rng.randint(0, len(params))
        sig = []
        for j, p in enumerate(params):
            sig.append(p if j < nreq else "%s=%s" % (p, self.pick(["none", "'dflt'", "1", "[]", "a" if j else "2"])))
        saved, saved_ns = list(self.scope), list(self.ns)
        self.scope = [(p, "any", None) for p in params]
        body = self.block(self.rng.randint(1, 2), 2)
        self.scope, self.ns = saved, saved_ns
        self.macros.append((name, nreq, params))
        return self.tag("macro %s(%s)" % (name, ", ".join(sig))) + body + self.text() + self.tag("endmacro")

    def template(self):
        s = ""
        for _ in range(self.rng.choice([0, 0, 0, 1, 2])):
            s += self.macro_def() + self.text()
        s += self.block(self.rng.randint(1, 5), 0) + self.text()
        return s


# ----------------------------------------------------------------------------------------------
# rendering


class Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise Timeout()


signal.signal(signal.SIGALRM, _alarm)


CTX_JSON = json.dumps(CTX, ensure_ascii=False)


def render_jinja2(src, ctx_json=CTX_JSON, env=ENV):
    # a fresh copy each time: jinja2 can mutate the context despite the immutable sandbox
    # ([1]|indent does `s += "\n"`, which extends a list in place)
    ctx = json.loads(ctx_json)
    signal.setitimer(signal.ITIMER_REAL, 2.0)
    try:
        return ("ok", env.from_string(src).render(**ctx))
    except Timeout:
        return ("timeout", "")
    except RecursionError:
        return ("timeout", "recursion")
    except MemoryError:
        return ("timeout", "memory")
    except Exception as e:  # noqa: BLE001 - every jinja2 failure is an outcome
        return ("error", "%s: %s" % (type(e).__name__, e))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def parses(src):
    try:
        ENV.parse(src)
        return True
    except Exception:  # noqa: BLE001
        return False


class Gemma:
    def __init__(self, binary):
        self.binary = binary
        self.p = None
        self.ctx_json = json.dumps(CTX, ensure_ascii=False)

    def start(self):
        self.p = subprocess.Popen([self.binary], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  encoding="utf-8", bufsize=1)

    def render(self, src, ctx_json=None):
        if self.p is None or self.p.poll() is not None:
            self.start()
        try:
            self.p.stdin.write('{"template": %s, "context": %s}\n' % (json.dumps(src), ctx_json or self.ctx_json))
            self.p.stdin.flush()
            line = self.p.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            rc = self.p.wait()
            self.p = None
            return ("crash", "gemma4c exited with %s" % rc)
        r = json.loads(line)
        if "output" in r:
            return ("ok", r["output"])
        return ("error", r["error"])


# ----------------------------------------------------------------------------------------------
# comparing

REPR_OBJECTS = re.compile(r"<[\w.]+ object at 0x|dict_items\(|dict_keys\(|dict_values\(|range\(|<generator object|<function |"
                          r"<bound method|<built-in method|<Macro |<Namespace|Undefined|<jinja2\.|"
                          r"<class |<method|LoopContext|<itertools|<map object|<filter object|<list_reverseiterator|"
                          r"Markup\(", re.I)
LAZY = re.compile(r"\|\s*(map|select|reject|selectattr|rejectattr|unique|reverse|items|batch|slice)\b")
UNSUPPORTED = re.compile(r"\.format\(|\|\s*(wordwrap|striptags|urlencode|filesizeformat|pprint|xmlattr|"
                         r"forceescape|groupby|urlize|random)\b")


def outcome_kind(j, g):
    """'agree', or the class of the difference: ignored ones are listed in IGNORED."""
    if j[0] == "timeout":
        return "agree"  # jinja2 itself ran away: nothing to compare
    if g[0] == "crash":
        return "crash"
    if j[0] == "error" and g[0] == "error":
        return "agree"
    if j[0] == "ok" and g[0] == "ok":
        return "agree" if j[1] == g[1] else "output"
    if j[0] == "ok":
        return "gemma-fails"
    return "jinja2-fails"


IGNORED = ("repr-objects", "lazy", "unsupported", "limits", "complex", "const-slice", "shadow-scope",
           "unknown-name", "markup")


def classify(src, j, g, gemma=None):
    k = outcome_kind(j, g)
    if k in ("agree", "crash"):
        return k
    if j[0] == "error" and g[0] == "ok" and re.match(r"TemplateAssertionError: No (filter|test) named", j[1]):
        return "unknown-name"
    if j[0] == "ok" and REPR_OBJECTS.search(j[1]):
        return "repr-objects"
    if j[0] == "ok" and g[0] == "error" and re.search(r"unhashable type: 'slice'|object is not subscriptable", g[1]):
        return "const-slice"
    if re.search(r"\|\s*(safe|e|escape)\b", src) and outcome_kind(render_jinja2(src, env=ENV_PLAIN), g) == "agree":
        return "markup"
    shadowed = [k for k in CTX if re.search(r"set\s+(\w+\s*,\s*)*%s\b" % k, src)]
    if shadowed and gemma is not None:
        # the same template without the context variables it assigns: if the two agree then, the
        # difference was which of the two a read saw
        ctx = json.dumps({k: v for k, v in CTX.items() if k not in shadowed}, ensure_ascii=False)
        if outcome_kind(render_jinja2(src, ctx), gemma.render(src, ctx)) == "agree":
            return "shadow-scope"
    if g[0] == "error" and "fractional power" in g[1]:
        return "complex"
    if g[0] == "error" and re.search(r"steps|limit|memory|integer overflow|too large", g[1]):
        return "limits"
    if g[0] == "error" and UNSUPPORTED.search(src) and re.search(r"not supported|no filter|no test|no method|"
                                                                 r"has no attribute|format", g[1]):
        return "unsupported"
    if k == "gemma-fails" and LAZY.search(src):
        return "lazy-maybe"  # confirmed by shrinking: ignored only if the lazy filter cannot be removed
    return k


TOKEN = re.compile(r"\{%[-+]?|[-+]?%\}|\{\{-?|-?\}\}|\{#-?|-?#\}|'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|"
                   r"\w+|\s+|.", re.S)


def shrink(src, gemma, kind, budget=3000):
    """Removes token ranges while jinja2 parses the template and the same kind of difference holds."""
    def signature(j, g):
        k = outcome_kind(j, g)
        if k == "gemma-fails":  # the same failure, not another one the cut made (a parse error)
            return k, re.sub(r"^template line \d+: ", "", g[1])
        if k == "jinja2-fails":
            return k, j[1].split(":")[0]
        return k, None

    want = signature(render_jinja2(src), gemma.render(src))

    def same(t):
        if not parses(t):
            return False
        j, g = render_jinja2(t), gemma.render(t)
        # the same kind of difference, and not one of an ignored class the cut turned it into
        return signature(j, g) == want and classify(t, j, g, gemma) not in IGNORED

    toks = TOKEN.findall(src)
    tries = 0
    n = max(1, len(toks) // 2)
    while n >= 1 and tries < budget:
        progress = False
        i = 0
        while i < len(toks) and tries < budget:
            cand = toks[:i] + toks[i + n:]
            tries += 1
            if cand and same("".join(cand)):
                toks = cand
                progress = True
            else:
                i += n
        if not progress:
            n //= 2
    # simplify whitespace runs
    for i, t in enumerate(toks):
        if t.isspace() and len(t) > 1 and tries < budget:
            for rep in (" ", "\n"):
                cand = toks[:i] + [rep] + toks[i + 1:]
                tries += 1
                if same("".join(cand)):
                    toks = cand
                    break
    return "".join(toks)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bin", default="build/tests/jinja-render")
    ap.add_argument("--max-report", type=int, default=200)
    ap.add_argument("--show-ignored", action="store_true")
    ap.add_argument("--unsupported", action="store_true")
    ap.add_argument("--no-shrink", action="store_true")
    args = ap.parse_args()
    if not os.path.exists(args.bin):
        sys.exit("%s not found: build first (cmake --build build --target jinja-render)" % args.bin)
    gemma = Gemma(args.bin)
    counts = {}
    outcomes = {"both ok": 0, "both fail": 0}
    reported = set()
    n_real = 0
    for k in range(args.n):
        seed = args.seed + k
        src = Gen(random.Random(seed), args.unsupported).template()
        j = render_jinja2(src)
        g = gemma.render(src)
        if j[0] == "ok" and g[0] == "ok":
            outcomes["both ok"] += 1
        elif j[0] != "ok" and g[0] != "ok":
            outcomes["both fail"] += 1
        c = classify(src, j, g, gemma)
        if c == "agree":
            continue
        small = src
        if not args.no_shrink and c not in IGNORED:
            small = shrink(src, gemma, c)
            if c == "lazy-maybe":
                c = "lazy" if LAZY.search(small) else "gemma-fails"
        counts[c] = counts.get(c, 0) + 1
        if c in IGNORED and not args.show_ignored:
            continue
        if c not in IGNORED:
            n_real += 1
        if small in reported or len(reported) >= args.max_report:
            continue
        reported.add(small)
        j2, g2 = render_jinja2(small), gemma.render(small)
        print("=== seed %d: %s%s" % (seed, c, " (ignored)" if c in IGNORED else ""))
        print("template: %s" % json.dumps(small, ensure_ascii=False))
        print("jinja2:   %s %s" % (j2[0], json.dumps(j2[1], ensure_ascii=False)[:400]))
        print("gemma4c:  %s %s" % (g2[0], json.dumps(g2[1], ensure_ascii=False)[:400]))
        sys.stdout.flush()
    print("%d templates (seeds %d..%d): %d both rendered, %d both failed; differences: %s; %d unique shown"
          % (args.n, args.seed, args.seed + args.n - 1, outcomes["both ok"], outcomes["both fail"],
             json.dumps(counts, sort_keys=True), len(reported)))
    sys.exit(1 if n_real else 0)


if __name__ == "__main__":
    main()
