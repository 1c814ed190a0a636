#!/usr/bin/env python3
"""Writes tests/data/jinja_cases.jsonl: templates rendered by jinja2 itself (the reference), with
the environment Hugging Face transformers uses for chat templates (ImmutableSandboxedEnvironment,
trim_blocks=True, lstrip_blocks=True, loopcontrols, tojson = json.dumps, raise_exception).

Each line: {"template", "context", "expected"} or {"template", "context", "error"} (the jinja2
exception).  tests/test_jinja.c renders every line with gemma4c's interpreter and compares.
Run from the repository root:  python3 tests/data/make_jinja_cases.py  (needs jinja2)."""
import json
import random
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception

CTX = {"d": {"k": 1, "b": "two"}, "x": {"a": [1, 2.5, "é", None, True]},
       "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": " yo "}],
       "n": None, "t": True, "s": "Hello World", "items": [3, 1, 2], "big": 123456789012}

# the characters whose Python upper-case form is longer than one character
FULL_UPPER = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000 and len(chr(c).upper()) > 1)

CASES = [
    # output of values: Python's str()
    "{{ 3 }} {{ -7 }} {{ none }} {{ true }} {{ false }} {{ n }} {{ t }}",
    "{{ 1.0 }} {{ 2.5 }} {{ -0.0 }} {{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 1e100 }}",
    "{{ 1/3 }} {{ 10/2 }} {{ 123456789.123 }} {{ 0.1 + 0.2 }} {{ big }} {{ big * 1000 }}",
    "{{ [1, 'a', none, true, 1.5, {'k': 'v'}, (1, 2)] }} {{ () }} {{ (1,) }} {{ [] }} {{ {} }}",
    "{{ [\"it's\", 'a\"b', 'a\\nb', 'tab\\t', 'back\\\\slash', 'both\\'\"'] }}",
    "{{ x }} {{ d }} {{ messages[0] }}",
    "{{ u }}|{{ u ~ 'x' }}|{{ 'a' ~ 1 ~ none ~ true ~ 1.5 ~ [1] }}",
    "{% set ns = namespace(a=1, b='x') %}{{ ns }}",
    # string literals and escapes
    "{{ 'a' 'b' \"c\" }}{{ 'a\\tb\\x41\\u00e9\\101\\q' }}{{ \"\\\"\" }}",
    "{{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 1_000 }} {{ 1e3 }} {{ 1.5e-3 }} {{ 2.5E2 }}",
    # arithmetic
    "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}",
    "{{ 2 ** 10 }} {{ 2 ** -1 }} {{ 2 ** 0.5 }} {{ -2 ** 2 }} {{ 10 / 4 }} {{ 1 + true }} {{ true + true }}",
    "{{ 1.5 + 1 }} {{ 3 - 1.5 }} {{ 3 * 'ab' }} {{ 'ab' * 2 }} {{ [1] * 3 }} {{ [0] * 0 }} {{ 'x' * -1 }}",
    "{{ [1] + [2] }} {{ (1, 2) + (3,) }} {{ 'a' + 'b' }} {{ -(1) }} {{ - 1.5 }} {{ +3 }}",
    # comparisons and logic
    "{{ 1 == 1.0 }} {{ true == 1 }} {{ [1] == (1,) }} {{ {'a': 1} == {'a': 1} }} {{ u == u }} {{ none == u }}",
    "{{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 != 2 }} {{ 'B' < 'a' }}",
    "{{ not 1 }} {{ not none }} {{ not u }} {{ 0 and 1 }} {{ [] or [1] }} {{ none or 'z' }} {{ 'a' and 'b' }}",
    "{{ 'k' in d }} {{ 'z' not in d }} {{ 2 in items }} {{ 'ell' in s }} {{ '' in s }} {{ x in u }}",
    "{{ 1 if true else 2 }} {{ 1 if false else 2 }} [{{ 'x' if false }}] {{ 'a' if 0 else 'b' if 1 else 'c' }}",
    # attribute / item access
    "{{ d.k }} {{ d['k'] }} {{ d.b }} [{{ d.nope }}] [{{ d['nope'] }}] [{{ none.x }}] [{{ items.x }}]",
    "{{ items[0] }} {{ items[-1] }} [{{ items[-4] }}] [{{ items[5] }}] {{ items.1 }} {{ s[0] }} {{ s[-1] }}",
    "{{ items[1:] }} {{ items[:-1] }} {{ items[::-1] }} {{ items[5:] }} {{ s[::2] }} {{ s[-5:] }} {{ 'héllo'[1:3] }}",
    "{{ messages[0]['role'] }} {{ messages[-1].content }} {{ messages[1:]|length }}",
    # loops
    "{% for x in items %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }};{% endfor %}",
    "{% for x in items %}{{ loop.cycle('a', 'b') }}{{ loop.previtem }}{{ loop.nextitem }}|{% endfor %}",
    "{% for x in items if x > 1 %}{{ x }}:{{ loop.index }}/{{ loop.length }} {% else %}E{% endfor %}",
    "{% for x in [] %}{{ x }}{% else %}empty{% endfor %}{% for x in u %}{{ x }}{% else %}U{% endfor %}",
    "{% for x in [1, 2, 3, 4] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% for a, b in [[1, 2], [3, 4]] %}{{ a }}{{ b }}{% endfor %}{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
    "{% for k in d %}{{ k }}{% endfor %}|{% for c in 'héllo' %}{{ c }}.{% endfor %}",
    "{% for i in range(3) %}{% for j in range(i) %}{{ i }}{{ j }}{{ loop.index }} {% endfor %}{{ loop.index }}|{% endfor %}",
    "{% for i in range(5, 0, -2) %}{{ i }}{% endfor %}{{ range(3)|list }}{{ range(2, 5)|list }}{{ range(0)|list }}",
    # scoping
    "{% set x = 'outer' %}{% for i in [1, 2] %}{{ x }}{% set x = i %}{{ x }}{% endfor %}{{ x }}",
    "{% for i in [1, 2] %}{% if i == 2 %}[{{ y }}]{% endif %}{% set y = i %}{% endfor %}[{{ y }}]",
    "{% if true %}{% set y = 5 %}{% endif %}{{ y }}",
    "{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}",
    "{% set x %}  hi {{ 1 }} {% endset %}[{{ x }}]{% set y %}{% set z = 1 %}{% endset %}[{{ z }}]",
    "{% set x | upper %}abc{% endset %}{{ x }}",
    "{% with a = 1, b = 2 %}{{ a }}{{ b }}{% set c = 3 %}{% endwith %}[{{ a }}][{{ c }}]",
    "{% filter upper %}ab{{ 'c' }}{% endfilter %}{% filter trim|upper %}  x  {% endfilter %}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = (3, 4) %}{{ c }}",
    "{% for i in [1, 2, 3] %}{% set x %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endset %}[{{ x }}]{% endfor %}",
    "{% for i in [1, 2, 3] %}{% filter upper %}a{% if i == 2 %}{% continue %}{% endif %}{% endfilter %}{{ i }}{% endfor %}",
    "{% for i in [1, 2, 3] %}{% with j = i %}{% if j == 2 %}{% break %}{% endif %}{{ j }}{% endwith %}{% endfor %}",
    # macros
    "{% macro m(a, b=a ~ 'x') %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}|{{ m(1, 2) }}|{{ m(b=3) }}|{{ m() }}",
    "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, z=3) }}",
    "{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}",
    "{% macro outer() %}{% macro inner(x) %}<{{ x }}>{% endmacro %}{{ inner(1) }}{{ inner(2) }}{% endmacro %}{{ outer() }}",
    "{{ m }}{% macro m(a) %}{{ a }}{% endmacro %}{{ m }}{{ m('z')|upper }}",
    "{% macro m() %}  x  {% endmacro %}[{{ m() }}][{{ m()|trim }}]",
    "{% macro later() %}{{ helper() }}{% endmacro %}{% macro helper() %}H{% endmacro %}{{ later() }}",
    "{% macro m(x) %}{% set x = x ~ '!' %}{{ x }}{% endmacro %}{{ m('a') }}",
    # filters
    "{{ ' a '|trim }}|{{ 'xxaxx'|trim('x') }}|{{ s|lower }}|{{ s|upper }}|{{ 'hello world-foo'|title }}|{{ 'hello World'|capitalize }}",
    "{{ items|sort }}|{{ items|sort(reverse=true) }}|{{ ['b', 'A', 'a']|sort }}|{{ ['b', 'A', 'a']|sort(case_sensitive=true) }}",
    "{{ [1, 2, 2, 1]|unique|list }}|{{ ['a', 'A', 'b']|unique|list }}|{{ items|first }}{{ items|last }}{{ items|sum }}{{ items|max }}{{ items|min }}",
    "{{ 'abc'|reverse }}|{{ items|reverse|list }}|{{ 'a-b-c'|replace('-', '+') }}|{{ 'a-b-c'|replace('-', '', 1) }}",
    "{{ '3'|int + 1 }}|{{ 'x'|int }}|{{ 'x'|int(7) }}|{{ '2.5'|float }}|{{ '1.9'|int }}|{{ 3.7|int }}|{{ ' 12 '|int }}|{{ 'ff'|int(base=16) }}",
    "{{ {'a': [1, 'x', none, true, 1.5]}|tojson }}|{{ {'a': 1, 'b': [1, 2]}|tojson(indent=2) }}|{{ 'é\"\\n<'|tojson }}",
    "{{ {'b': 1, 'a': [1, {}]}|tojson(sort_keys=true) }}|{{ [1, [2, []]]|tojson(indent=1) }}|{{ x|tojson }}|{{ 'é'|tojson(ensure_ascii=true) }}",
    "{{ 'a\\nb'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent }}|{{ 'a\\n\\nb'|indent(1, blank=true) }}",
    "{{ [{'a': 1}, {'a': 2}]|map(attribute='a')|list }}|{{ [{'a': 1}, {'b': 2}]|selectattr('a')|list }}|{{ [1, 2, 3, 4]|select('odd')|list }}|{{ [1, 2, 3, 4]|reject('even')|list }}",
    "{{ [1, 2, 3]|select('>', 1)|list }}|{{ [1, 2, 3]|reject('in', [2])|list }}|{{ [{'n': 1}, {'n': 5}]|rejectattr('n', 'gt', 2)|list }}",
    "{{ [{'n': 2}, {'n': 1}]|sort(attribute='n') }}|{{ [{'n': 'b'}, {}]|map(attribute='n', default='z')|join }}",
    "{{ {'b': 1, 'A': 2, 'a': 3}|dictsort }}|{{ {'a': 2, 'b': 1}|dictsort(by='value') }}|{{ {'a': 1, 'b': 2}|dictsort(reverse=true) }}",
    "{{ {'b': 1, 'A': 2, 'a': 3}|dictsort(case_sensitive=true) }}",
    "{{ [1, 2, 3]|map('string')|join('-') }}|{{ ['a', 'B']|map('lower')|list }}|{{ ['a', 'b']|map('upper')|list }}|{{ items|join }}",
    "{{ 'abc'|first }}{{ d|first }}[{{ []|first }}]|{{ 'abc'|last }}|{{ 'abc'|list }}|{{ d|list }}|{{ d|items|list }}",
    "{{ 5|abs }}{{ -5|abs }}{{ -5.5|abs }}|{{ 'ab'|center(6) }}|{{ 'hello world foo'|wordcount }}|{{ ['b', 'a']|min }}",
    "{{ 2.5|round }}|{{ 3.5|round }}|{{ 3.14159|round(2) }}|{{ 7|round }}|{{ 2.1|round(0, 'ceil') }}|{{ 2.9|round(0, 'floor') }}",
    "{{ u|default('d') }}|{{ none|default('d') }}|{{ ''|default('d', true) }}|{{ 0|d(5) }}|{{ u|d }}|{{ d|length }}|{{ s|length }}|{{ u|length }}",
    "{{ '<a href=\"x\">&'|e }}|{{ '<b>'|escape }}|{{ '<b>'|safe }}|{{ 5|string ~ 'x' }}|{{ '%s-%d'|format('a', 3) }}",
    "{{ d|attr('items') is callable }}|{{ d|attr('k') }}",
    # lazy filter results (generators in jinja2): always true, no len(), consumed by list/join/for
    "{% if []|select('odd') %}T{% endif %}{% if []|map('upper') %}T{% endif %}{{ not ([]|unique) }}{{ ([]|reverse) is sequence }}",
    "{% for x in items|select('odd') %}{{ x }}{{ loop.length }}{% endfor %}|{{ items|reject('odd')|join }}|{{ items|map('string')|list|length }}",
    "{{ items|select('odd')|first }}|{{ 3 in items|select('odd') }}|{{ items|unique|sort }}|{{ d|items|list }}",
    "{{ '%s and %s' % ('a', 1) }}|{{ '%d%%' % 50 }}|{{ '%5.1f|%-4s|%03d' % (3.14159, 'ab', 7) }}|{{ '%(k)s' % d }}|{{ '%r' % 'x' }}|{{ 'no spec' % items }}",
    "{{ '%s'|format('a') }}|{{ '%(a)s-%(b)s'|format(a=1, b=2) }}|{{ '%x %X %o %e %g %c' % (255, 255, 8, 12345.678, 0.0001, 65) }}",
    # tests
    "{{ 'x' is string }}{{ 1 is string }}{{ {} is mapping }}{{ [] is mapping }}{{ none is none }}{{ u is defined }}{{ u is undefined }}{{ true is boolean }}{{ 1 is boolean }}",
    "{{ u is sequence }}{{ u is iterable }}{{ {} is sequence }}{{ none is sequence }}{{ 'a' is sequence }}{{ 3 is iterable }}",
    "{{ true is number }}{{ true is integer }}{{ 1.0 is integer }}{{ 1.0 is float }}{{ 3 is number }}{{ 'x' is number }}",
    "{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(4) }}{{ 'a' is in 'abc' }}{{ 1 is eq 1 }}{{ 2 is gt 1 }}{{ 2 is le 1 }}",
    "{{ 'abc' is lower }}{{ 'aBc' is lower }}{{ 'ABC' is upper }}{{ none is sameas none }}{{ true is true }}{{ 1 is true }}{{ false is false }}",
    "{{ m is callable }}{{ range is callable }}{{ 'upper' is filter }}{{ 'nope' is filter }}{{ 'odd' is test }}",
    "{% if u is not defined %}U{% endif %}{% if n is not none %}N{% else %}n{% endif %}{{ 1 is not string and true }}",
    # methods
    "{{ s.upper() }}{{ s.lower() }}{{ 'a,b,,c'.split(',') }}{{ 'a,b,,c'.split(',', 1) }}{{ ' a  b '.split() }}{{ 'a b c'.split(none, 1) }}",
    "{{ 'aXbXc'.rsplit('X', 1) }}{{ ' a b c '.split(None, 1) }}{{ ' a b c '.rsplit(None, 1) }}{{ ''.split() }}{{ ''.split(',') }}",
    "{{ ' x '.strip() }}|{{ '  x'.lstrip() }}|{{ 'x--'.rstrip('-') }}|{{ 'xyzzyx'.strip('xy') }}|{{ s.startswith('He') }}{{ s.endswith(('x', 'ld')) }}",
    "{{ 'abc'.replace('b', 'x') }}{{ 'aaa'.replace('a', 'b', 2) }}{{ 'ab'.replace('', '-') }}{{ 'abcabc'.find('c') }}{{ 'abcabc'.rfind('c') }}{{ 'abc'.find('x') }}",
    "{{ 'abcabc'.count('bc') }}{{ '-'.join(['x', 'y']) }}{{ 'a\\nb\\r\\nc'.splitlines() }}{{ 'hello wORLD'.title() }}{{ 'hELLO'.capitalize() }}",
    "{{ '12'.isdigit() }}{{ '1a'.isdigit() }}{{ 'ab'.isalpha() }}{{ 'a1'.isalnum() }}{{ '  '.isspace() }}{{ 'AB'.isupper() }}{{ 'ab'.islower() }}",
    "{{ d.get('k') }}{{ d.get('z') }}{{ d.get('z', 5) }}{{ d.keys()|list }}{{ d.values()|list }}{{ d.items()|list }}",
    "{{ items.index(1) }}{{ items.count(3) }}{{ 'prefix-x'.removeprefix('prefix-') }}{{ 'x.txt'.removesuffix('.txt') }}",
    "{{ 'ÄÖü'.lower() }}{{ 'straße'.upper() }}{{ 'élan'|capitalize }}{{ 'ﬁ'.upper() }}",
    # Python's multi-character case forms: every upper-case one, and U+0130's lower-case one (dictsort and sort
    # compare keys lower-cased, so they decide the order of a tool's arguments)
    "{{ '%s'.upper() }}|{{ '%s'|upper }}|{{ 'İstanbul'.lower() }}{{ 'İ'|lower|length }}{{ 'straße'.title() }}"
    % (FULL_UPPER, FULL_UPPER),
    # the final sigma of lower(): after a cased letter, no cased letter following (case-ignorable ones between)
    "{{ 'ΟΔΥΣΣΕΥΣ'.lower() }}|{{ 'ΣΑ Σ ΑΣ. ΑΣ\\'Α ΑΣ\\'. Α\u0301Σ 1Σ ΣΣ aΣb aΣ'|lower }}|{{ 'ΑΣ\u0301'.lower() }}"
    "|{{ 'ΑΣ\u00adΒ ΑΣ:ΒΣ ΑΣ·'.lower() }}|{{ ['ΑΣ', 'αΣ', 'Σ']|map('lower')|list }}",
    # title case: str.title() and capitalize() title-case (digraphs, ligatures, ß, Georgian, Greek with
    # ypogegrammeni), jinja's title filter upper-cases a word's first character and lower-cases the rest on its own
    "{{ 'ǆemal ǉubav ǌego ǳ ßa ﬁsh ﬃx ᾳδης მამა ΑΣ ΟΔΥΣΣΕΥΣ ιΣ'.title() }}|{{ 'ǆemal ΣΑΣ'.capitalize() }}|"
    "{{ 'ßa'|capitalize }}|{{ 'ﬁsh ǆemal-ǉubav (ΑΣ ΣΣ ßa მამა ᾳδης'|title }}|{{ 'a中b 1a éCOLE'.title() }}",
    "{{ {'İ': 0, 'i': 1, 'j': 2, 'I': 3, 'ı': 4}|dictsort }}{{ ['İb', 'ia', 'ic', 'Ia']|sort }}{{ ['ﬃx', 'ffiy', 'FFIa']|sort }}",
    # namespaces and dicts
    "{% set ns = namespace() %}{% set ns.a = [1] %}{% set ns.b = ns.a + [2] %}{{ ns.b }}{{ ns.c }}",
    "{% set ns = namespace({'x': 1}) %}{{ ns.x }}{% set d2 = dict(a=1, b=2) %}{{ d2 }}{{ dict({'z': 0}, y=1) }}",
    "{{ {'a': 1, 'b': {'c': [1, 2]}}['b']['c'][1] }}{{ {1: 'int key', 'x': 2}[1] }}",
    # globals
    "{{ range(3) is sequence }}{{ namespace is callable }}",
    # HF chat-template idioms
    "{% for m in messages %}{% if loop.first and m.role == 'user' %}F{% endif %}{{ m.role|upper }}:{{ m.content|trim }}{% if not loop.last %},{% endif %}{% endfor %}",
    "{%- for message in messages -%}\n  {{- '<' + message['role'] + '>' -}}\n  {{ message['content'] }}\n{%- endfor -%}\n",
    "{{- bos -}}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n    {%- set loop_messages = messages -%}\n{%- endif -%}\n{{ loop_messages|length }}",
    "{% set content = messages[1]['content'] %}{% if '</think>' in content %}{{ content.split('</think>')[-1].lstrip('\\n') }}{% else %}{{ content }}{% endif %}",
    # whitespace control, trim_blocks and lstrip_blocks
    "a\n  {% if true %}\n  b\n  {% endif %}\n  c\n",
    "a  {% if true %} b {% endif %}  c",
    "{# c #}\n  {# c2 #}\nx\n",
    "  {%+ if true %}x{% endif +%}\n y",
    "{%- if true -%}\n  x  \n{%- endif -%}\n y",
    "{% raw %}{{ x }}{% endraw %}|{%- raw -%}  {{ y }}  {%- endraw -%}  |",
    "line1\r\nline2\r{% if true %}\r\nx{% endif %}\r\n",
    "{{ 1 }}\n{{ 2 }}\n\n",
    "x {{- ' y ' -}} z\n  {%- set a = 1 %}\n   {% set b = 2 -%}  \n  w",
    "<{% for i in range(2) %}\n    {{ i }}\n{% endfor %}>",
    "{% if true %}\n\n{% endif %}\n",
    "{{ '{{' }}{{ '}}' }}{{ {'a': {'b': 1}} }}",
    "{{ 'a' ~ \"b\" -}}\n\n   c",
    # range() at the ends of the 64-bit integers (the last step must not overflow)
    "{{ range(9223372036854775806, 9223372036854775807, 5)|list }}{{ range(9223372036854775800, 9223372036854775807, 3)|list }}",
    "{% set min = -9223372036854775807 - 1 %}{{ range(-9223372036854775807, min, -7)|list }}{{ range(-9223372036854775803, min, -2)|list }}",
    "{% set min = -9223372036854775807 - 1 %}{{ range(9223372036854775807, 9223372036854775797, -4)|list }}{{ range(min, -9223372036854775800, 9223372036854775807)|list }}",
    "{% set min = -9223372036854775807 - 1 %}{{ range(9223372036854775807)|length }}{{ range(min, 9223372036854775807, 4611686018427387904)|list }}",
    # errors (jinja2 raises; the interpreter must report an error, never crash)
    "{{ u + 'x' }}", "{{ u.x }}", "{{ u['x'] }}", "{{ u() }}", "{{ d.nope.x }}", "{{ 'a' + 1 }}",
    "{{ 1 < 'a' }}", "{{ 1 / 0 }}", "{{ 1 // 0 }}", "{{ 1 % 0 }}", "{{ 'a' in none }}", "{{ 1 in 'abc' }}",
    "{% for x in none %}{% endfor %}", "{% for x in 3 %}{% endfor %}", "{% for a, b in [[1, 2, 3]] %}{% endfor %}",
    "{{ raise_exception('boom') }}", "{{ items.append(4) }}", "{{ none|length }}", "{{ range(100001)|length }}",
    "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", "{% macro m(a) %}{% endmacro %}{{ m(1, z=3) }}",
    "{% macro m(a) %}{% endmacro %}{{ m(1, a=2) }}", "{{ nope() }}", "{{ d() }}", "{{ 3|nosuchfilter }}",
    "{{ 3 is nosuchtest }}", "{% set x.y = 1 %}", "{{ 'a'.split('') }}", "{{ {[1]: 2} }}", "{{ -'a' }}",
    "{% for x in [1] %}", "{% if true %}x", "{% endif %}", "{{ 1 + }}", "{{ (1, 2 }}", "{{ 'abc }}",
    "{% nosuchtag %}", "{{ 1 }", "{# open comment", "{% raw %}x", "{% for x in [1] %}{% endif %}",
    "{% macro %}{% endmacro %}", "{{ x is string is string }}", "{% break %}", "{{ 1.__class__ }}",
    "{% include 'x.html' %}", "{% extends 'base' %}", "{% call m() %}{% endcall %}", "{{ a = 1 }}",
    "{{ [1, 2)] }}", "{{ ] }}", "{{ 'x' * 'y' }}", "{{ {} + {} }}", "{{ 2 ** 'a' }}", "{{ [1] < 'a' }}",
    "{{ items|select('odd')|length }}", "{{ items|map('string')|tojson }}", "{{ items|unique|last }}",
    "{{ '%s %s' % ('a',) }}", "{{ '%s' % ('a', 'b') }}", "{{ '%d' % 'x' }}", "{{ '%(z)s' % d }}", "{{ '%q' % 1 }}",
    "{{ n[1:] }}", "{{ d[1:] }}", "{{ [1] in d }}", "{{ {(1, 2): 'pair'}[1, 2] }}{{ d[1, 2] }}", "{{ 10.0 ** 400 }}", "{{ s is sequence(1) }}",
    # divergences found by the differential fuzzer tests/data/jinja_diff.py
    "{{ [none, none]|sort }}{{ [{'a': 1}, {'a': 1}]|sort }}{{ [[1], [1, 2]]|sort }}{{ messages|sort(attribute='name')|map(attribute='role')|join }}",
    "{{ [{'a': 1}, {'a': 2}]|sort }}",
    "{{ [{'n': 1}, {}]|sort(attribute='n') }}",
    "{{ [1, 2, 3, 4, 5]|batch(2)|list }}{{ 'abcde'|batch(3, 'x')|list }}{{ []|batch(2)|list }}{{ [1, 2, 3]|batch(0)|list }}{{ [1, 2]|batch(-1)|list }}",
    "{{ [1, 2, 3, 4, 5]|slice(2)|list }}{{ [1, 2, 3, 4, 5]|slice(3, 'x')|list }}{{ [1]|slice(3)|list }}{{ d|slice(1)|list }}{{ [1, 2, 3]|slice(-2)|list }}{% for col in range(7)|slice(3) %}{{ col|join }};{% endfor %}",
    "{{ [1, 2]|slice(0)|list }}",
    "{{ [1, 2]|batch(2)|length }}",
    "{{ 15|round(-1) }} {{ 25|round(-1) }} {{ -15|round(-1) }} {{ -26|round(-1) }} {{ 150|round(-2) }} {{ true|round(-1) }} {{ 123|round(-20) }} {{ 14.5|round(-1) }} {{ 7|round(-1, 'ceil') }}",
    "{{ -0.0|round(1, 'ceil') }} {{ -0.04|round(1, 'ceil') }} {{ -0.5|round(0, 'ceil') }} {{ -0.0|round(2, 'floor') }} {{ -0.0|round }} {{ -0.04|round(1) }}",
    "{{ [{'a': {'b': 1}}, {}]|map(attribute='a.b')|list }}",
    "{{ [{'a': {'b': 1}}, {'a': 3}]|map(attribute='a.b')|list }}|{{ [{'a': {'b': 1}}, {}]|map(attribute='a.b', default='x')|list }}|{{ [{'a': 1}, {}]|map(attribute='a', default=none)|list }}|{{ [[1], []]|map(attribute=0, default=7)|list }}",
    "{{ messages|selectattr('tool_calls.0')|list }}",
    "{{ [{'a': 1, 'b': 2}, {'a': 1, 'b': 1}, {'a': 0, 'b': 3}]|sort(attribute='a,b') }}{{ [{'a': 'X', 'b': 2}, {'a': 'x', 'b': 1}]|sort(attribute='a,b') }}{{ [{'a': 'X', 'b': 2}, {'a': 'x', 'b': 1}]|sort(attribute='a,b', case_sensitive=true, reverse=true) }}",
    "{% for x in [1, 2] %}{% if x == 1 %}{% break %}{% endif %}{% else %}E{% endfor %}|{% for x in [1, 2] %}{% continue %}{% else %}E{% endfor %}|{% for x in [1, 2] %}{{ x }}{% if x == 2 %}{% break %}{% endif %}{% else %}E{% endfor %}|{% for m in messages %}{% if m.role == 'user' %}{% break %}{% endif %}{% else %}no user{% endfor %}",
    "{% for y in [1, 2] %}{% for x in [] %}{% else %}{% break %}{% endfor %}{{ y }}{% endfor %}|{% for y in [1, 2] %}{% for x in [] %}{% else %}{% continue %}{% endfor %}{{ y }}{% endfor %}|{% for y in [7] %}{% for x in [1] %}{% break %}{% else %}{{ x }}{{ loop.index }}{% endfor %}{% endfor %}",
    "{% for x in [] %}{% else %}{% break %}{% endfor %}",
    "{{ ([1],) in d }}",
    "{{ {(1, [2]): 3} }}",
    "{{ (1, (2, {})) in d }}",
    "{{ (1, 2) in {(1, 2): 0} }}{{ {(1, (2, 'a')): 3} }}",
    "{{ dict(nope) }}",
    "{{ namespace(nope) }}",
    "{{ s.split(None, 1) }}{{ s.rsplit(None, 1) }}{{ '  a  b  c  '.split(None, 2) }}{{ '  a  b  c  '.rsplit(None, 2) }}{{ '  a  b  c  '.split(None, 3) }}{{ ' a '.split(None, 0) }}{{ ' a '.rsplit(None, 0) }}{{ ' a '.split(None, 1) }}",
    "{{ ' ﬁ'.islower() }}{{ 'ǅa'.islower() }}{{ 'ǅA'.isupper() }}{{ 'ªb'.islower() }}{{ 'Ⅻ'.isupper() }}{{ 'ⓐ'.islower() }}{{ 'ß'.islower() }}{{ 'ᾈ'.isupper() }}{{ 'ǅ'.islower() }}{{ 'ŉ'.islower() }}",
    "{{ '%a' % 'é' }}{{ '%a|%a|%a' % ('中😀\\n', ['ü', 1], {'ß': 'x'}) }}{{ '%.4a|%8a' % ('éé', 'é') }}",
    "{{ ('nan'|float)|int }}|{{ 'nan'|int(7) }}|{{ 'inf'|int }}|{{ '-inf'|int(3) }}|{{ '1e400'|int(4) }}",
    "{% set v = 'inf'|float %}{{ v|int }}",
    "{{ '１２'|int }}|{{ '٣.٥'|float }}|{{ '\u2003 42\u3000'|int }}|{{ '1２x'|int(9) }}|{{ '𝟙𝟚'|int }}|{{ '१०'|float }}|{{ '-١'|int }}|{{ 'é'|int(5) }}|{{ '０x1A'|int(0, 16) }}",
    "{{ 'x'|tojson(indent='\\t') }}{{ {'a': [1, {'b': 2}]}|tojson(indent='--') }}{{ [1, 2]|tojson(indent='') }}{{ {'a': []}|tojson(indent=0) }}{{ {'a': [1, 2]}|tojson(indent=-1) }}{{ [1, [2]]|tojson(indent=true) }}",
    "{{ 'foo bar baz qux'|truncate(9) }}|{{ 'foo bar baz qux'|truncate(9, true) }}|{{ 'foo bar baz qux'|truncate(11, false, '…', 0) }}|{{ 'foo bar baz qux'|truncate(13) }}|{{ 'foobarbazqux'|truncate(6, leeway=0) }}|{{ 'héllo wörld ünïcode'|truncate(10, leeway=0) }}|{{ nope|truncate(3) }}|{{ ('word ' * 60)|truncate|length }}",
    "{{ 'abc'|truncate(2) }}",
    "{{ '%s' % (s,)|truncate() }}{{ [1, 2]|truncate(3) }}{{ {'a': 1}|truncate(3) }}[{{ nope|truncate(3) }}]",
    "{{ [1, 2, 3, 4, 5, 6, 7, 8, 9]|truncate(3) }}",
    "{{ x.a|safe in '%s' % x }}{{ (1|safe)|length }}{{ [1]|safe|first }}{{ none|safe }}[{{ nope|safe }}]{{ (nope|safe) is defined }}{{ 1.5|safe }}",
    "{{ '%03d' % (3|safe) }}",
]


def random_whitespace_cases(count, seed):
    rng = random.Random(seed)
    pieces = ["{% if true %}", "{%- if true %}", "{% if true -%}", "{%- if true -%}", "{%+ if true %}",
              "{% if true +%}", "{{ 1 }}", "{{- 1 }}", "{{ 1 -}}", "{{- 1 -}}", "{# c #}", "{#- c #}",
              "{# c -#}", "{#- c -#}", "{% set x = 1 %}", "{%- set x = 1 -%}", "{% raw %}r{% endraw %}"]
    texts = ["", " ", "  ", "\n", " \n", "\n ", "\n\n", "a", " a ", "\n  ", "\t\n\t", "x\n  "]
    out = []
    for _ in range(count):
        t, opened = "", 0
        for _ in range(rng.randint(1, 4)):
            p = rng.choice(pieces)
            t += rng.choice(texts) + p
            opened += "if true" in p
        t += rng.choice(texts)
        for _ in range(opened):
            t += rng.choice(["{% endif %}", "{%- endif %}", "{% endif -%}", "{%- endif -%}"]) + rng.choice(texts)
        out.append(t)
    return out


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/data/jinja_cases.jsonl"
    n_err = 0
    with open(path, "w", encoding="utf-8") as f:
        for t in CASES + random_whitespace_cases(200, 7):
            line = {"template": t, "context": CTX}
            try:
                line["expected"] = env.from_string(t).render(**CTX)
            except Exception as e:  # noqa: BLE001 - every jinja2 failure is a test case
                line["error"] = "%s: %s" % (type(e).__name__, e)
                n_err += 1
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    print("%s: %d cases (%d errors) with jinja2 %s" % (path, len(CASES) + 200, n_err, jinja2.__version__))


if __name__ == "__main__":
    main()
