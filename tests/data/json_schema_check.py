#!/usr/bin/python3
"""Checks tests/test_grammar.c's verdicts and outputs with Python's jsonschema (an independent validator).

argv[1]: JSON lines {"schema": S, "doc": D, "valid": bool[, "unparsable": true]} (or {"regex": R, ...}: a whole-output
regular expression, judged by re.fullmatch): the grammar's verdict on D
(accepted whole or not) must be jsonschema's (an unparsable D is invalid), but for "reordered": true, a document
jsonschema accepts and the grammar refuses for its properties' order or a needless escape.
argv[2]: JSON lines of generations: {"schema": text, "text": output, "finished": bool}: a finished output must be
a document the schema accepts; {"schema_json": S, "doc": D, "finished": true}: tool-call arguments D must follow S.
"""
import json
import re
import sys

import jsonschema


def valid(schema, doc):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    checker = cls.FORMAT_CHECKER
    try:
        jsonschema.validate(doc, schema, cls=cls, format_checker=checker)
        return True
    except jsonschema.ValidationError:
        return False


def main():
    bad = 0
    n_cases = n_outs = 0
    with open(sys.argv[1]) as f:
        for line in f:
            c = json.loads(line)
            n_cases += 1
            if "regex" in c:  # a whole-output regular expression: Python's re.fullmatch
                want = re.fullmatch(c["regex"], c["doc"]) is not None
                if want != c["valid"]:
                    print(f"re.fullmatch says {want}, the grammar {c['valid']}: {c['regex']!r} / {c['doc']!r}")
                    bad += 1
                continue
            want = False if c.get("unparsable") else valid(c["schema"], c["doc"])
            if c.get("reordered"):  # JSON Schema takes it; the grammar keeps the schema's order, JSON's plain form
                want = not want
            if want != c["valid"]:
                print(f"jsonschema says {want}, the grammar {c['valid']}: {json.dumps(c['schema'])} / {json.dumps(c['doc'])}")
                bad += 1
    with open(sys.argv[2]) as f:
        for line in f:
            o = json.loads(line)
            n_outs += 1
            if not o["finished"]:
                continue
            if "schema_json" in o:
                schema, doc = o["schema_json"], o["doc"]
            else:
                schema = json.loads(o["schema"])
                try:
                    doc = json.loads(o["text"])
                except ValueError as e:
                    print(f"output is not JSON ({e}): {o['text']!r}")
                    bad += 1
                    continue
            if not valid(schema, doc):
                print(f"output does not follow its schema: {json.dumps(schema)} / {json.dumps(doc)}")
                bad += 1
    print(f"jsonschema: {n_cases} verdicts, {n_outs} outputs, {bad} disagreements")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
