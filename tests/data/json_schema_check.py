#!/usr/bin/python3
"""Checks tests/test_grammar.c's verdicts and outputs with Python's jsonschema (an independent validator).

argv[1]: JSON lines {"schema": S, "doc": D, "valid": bool[, "unparsable": true]} (or {"regex": R, ...}: a whole-output
regular expression, judged by re.fullmatch): the grammar's verdict on D
(accepted whole or not) must be jsonschema's (an unparsable D is invalid), but for "reordered": true, a document
jsonschema accepts and the grammar refuses for its properties' order or a needless escape.
argv[2]: JSON lines of generations: {"schema": text, "text": output, "finished": bool}: a finished output must be
a document the schema accepts; {"schema_json": S, "doc": D, "finished": true}: tool-call arguments D must follow S.
"""
import decimal
import json
import re
import sys

import jsonschema


# Formats jsonschema leaves unchecked here (hostname and duration need packages Debian does not have; its email
# check is only for an "@"): the standards' rules written out, to judge the grammar's verdicts.
ATEXT = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$%&'*+/=?^_`{|}~-")
LDH = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")


def rfc1123_hostname(s):
    """RFC 1123 2.1 / RFC 1035 2.3.4: dot-separated labels of 1-63 letters, digits, hyphens, no hyphen at either end,
    253 characters at most."""
    if not isinstance(s, str):
        return True
    if not 0 < len(s) <= 253:
        return False
    return all(0 < len(lb) <= 63 and set(lb) <= LDH and lb[0] != "-" and lb[-1] != "-" for lb in s.split("."))


def rfc5321_email(s):
    """RFC 5321 4.1.2 Dot-string "@" Domain (4.5.3.1: local part 64 octets, a path 256 with its brackets)."""
    if not isinstance(s, str):
        return True
    local, at, domain = s.rpartition("@")
    if not at or not 0 < len(local) <= 64 or len(s) > 254:
        return False
    return all(atom and set(atom) <= ATEXT for atom in local.split(".")) and rfc1123_hostname(domain)


def rfc3339_duration(s):
    """RFC 3339 appendix A: "P" (dur-date / dur-time / dur-week); dur-date = (day / month [day] / year [month [day]])
    [dur-time]; dur-time = "T" (hour [minute [second]] / minute [second] / second)."""
    if not isinstance(s, str):
        return True
    if not s.startswith("P"):
        return False

    def units(part):  # "1Y2M" -> "YM"; None where a unit has no digits or digits no unit
        out, digits = "", 0
        for ch in part:
            if "0" <= ch <= "9":
                digits += 1
            elif digits:
                out, digits = out + ch, 0
            else:
                return None
        return None if digits else out

    date, t, time = s[1:].partition("T")
    du, tu = units(date), units(time)
    if du is None or tu is None or (t and not tu) or (not du and not tu):
        return False
    if du == "W":
        return not t
    return du in ("", "D", "M", "MD", "Y", "YM", "YMD") and tu in ("", "H", "HM", "HMS", "M", "MS", "S")


def is_integer(checker, instance):
    """JSON Schema's integers: numbers whose fraction is zero (5.0 too), decimals included."""
    if isinstance(instance, decimal.Decimal):
        return instance.is_finite() and instance == instance.to_integral_value()
    return jsonschema._types.is_integer(checker, instance)


def valid(schema, doc):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls = jsonschema.validators.extend(cls, type_checker=cls.TYPE_CHECKER.redefine("integer", is_integer))
    checker = cls.FORMAT_CHECKER
    checker.checks("hostname")(rfc1123_hostname)
    checker.checks("email")(rfc5321_email)
    checker.checks("duration")(rfc3339_duration)
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
            c = json.loads(line, parse_float=decimal.Decimal)  # exact decimals: multipleOf 0.01 takes 3.14
            n_cases += 1
            if "regex" in c:  # a whole-output regular expression: Python's re.fullmatch
                want = re.fullmatch(c["regex"], c["doc"]) is not None
                if want != c["valid"]:
                    print(f"re.fullmatch says {want}, the grammar {c['valid']}: {c['regex']!r} / {c['doc']!r}")
                    bad += 1
                continue
            if "doc_text" in c and not c.get("unparsable"):  # the texts as written, numbers as exact decimals
                c["schema"] = json.loads(c["schema_text"], parse_float=decimal.Decimal)
                c["doc"] = json.loads(c["doc_text"], parse_float=decimal.Decimal)
            want = False if c.get("unparsable") else valid(c["schema"], c["doc"])
            if c.get("reordered"):  # JSON Schema takes it; the grammar keeps the schema's order, JSON's plain form
                want = not want
            if want != c["valid"]:
                print(f"jsonschema says {want}, the grammar {c['valid']}: {json.dumps(c['schema'], default=str)} / {json.dumps(c['doc'], default=str)}")
                bad += 1
    with open(sys.argv[2]) as f:
        for line in f:
            o = json.loads(line, parse_float=decimal.Decimal)
            n_outs += 1
            if not o["finished"]:
                continue
            if "schema_json" in o:
                schema, doc = o["schema_json"], o["doc"]
            else:
                schema = json.loads(o["schema"], parse_float=decimal.Decimal)
                try:
                    doc = json.loads(o["text"], parse_float=decimal.Decimal)
                except ValueError as e:
                    print(f"output is not JSON ({e}): {o['text']!r}")
                    bad += 1
                    continue
            if not valid(schema, doc):
                print(f"output does not follow its schema: {json.dumps(schema, default=str)} / {json.dumps(doc, default=str)}")
                bad += 1
    print(f"jsonschema: {n_cases} verdicts, {n_outs} outputs, {bad} disagreements")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
