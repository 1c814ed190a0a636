#!/usr/bin/env bash
# gemma4c template: renders every case of the public chat fixtures (grouped by template) and
# compares each output line with transformers' text; checks -m DIR, stdin / -f, and that a bad
# input line gives {"error": ...} in its place while the others still render (exit status 1).
set -u
BIN=${G4_BIN:?}
SHARED=${G4_SHARED_DIR:?}
TMP=${G4_TMP:-/tmp}/test_template.$$
FIX="$SHARED/tokenizer/fixtures/public/chat.jsonl"
CFG="$SHARED/tokenizer/tokenizer_config.json"
command -v python3 >/dev/null 2>&1 || { echo "python3 not found: skipping"; exit 77; }
mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT
fail=0
pass=0

# compare OUT_FILE with the "text" fields of IN_FILE, line by line
compare() {
  python3 - "$1" "$2" <<'EOF'
import json, sys
want = [json.loads(l)["text"] for l in open(sys.argv[1], encoding="utf-8") if l.strip()]
got = [json.loads(l) for l in open(sys.argv[2], encoding="utf-8") if l.strip()]
bad = [i for i, (w, g) in enumerate(zip(want, got)) if w != g]
if len(want) != len(got) or bad:
    print("  %d expected lines, %d output lines, differing: %s" % (len(want), len(got), bad[:10]))
    sys.exit(1)
print("  %d lines match" % len(want))
EOF
}

for tpl in "$SHARED"/chat_templates/*.jinja; do
  name=$(basename "$tpl" .jinja)
  grep -F "\"template\": \"$name\"" "$FIX" > "$TMP/$name.in"
  [ -s "$TMP/$name.in" ] || continue
  echo "template $name:"
  if "$BIN" template --template "$tpl" --tokenizer-config "$CFG" -f "$TMP/$name.in" > "$TMP/$name.out" \
     && compare "$TMP/$name.in" "$TMP/$name.out"; then
    pass=$((pass + 1))
  else
    echo "FAIL: template $name"; fail=1
  fi
done
[ "$pass" -ge 3 ] || { echo "FAIL: expected fixtures for 3 templates, got $pass"; fail=1; }

# a model folder, input on stdin
mkdir -p "$TMP/model"
cp "$SHARED/chat_templates/gemma-4-e2b-it.release.jinja" "$TMP/model/chat_template.jinja"
cp "$CFG" "$TMP/model/tokenizer_config.json"
echo "model folder (stdin):"
if "$BIN" template -m "$TMP/model" < "$TMP/gemma-4-e2b-it.release.in" > "$TMP/model.out" \
   && compare "$TMP/gemma-4-e2b-it.release.in" "$TMP/model.out"; then :; else
  echo "FAIL: -m DIR"; fail=1
fi

# bad lines in between good ones: an error object in place, the rest rendered, exit 1
good=$(head -n 1 "$TMP/gemma-4-e2b-it.release.in")
# (chat_template_kwargs setting a variable the render sets itself: transformers raises a TypeError)
printf '%s\nnot json\n{"messages": "x"}\n\n{"messages": [], "tools": 3}\n{"messages": [], "chat_template_kwargs": {"messages": []}}\n%s\n' \
  "$good" "$good" > "$TMP/mixed.in"
"$BIN" template -m "$TMP/model" -f "$TMP/mixed.in" > "$TMP/mixed.out" 2> "$TMP/mixed.err"
rc=$?
echo "mixed input: exit $rc"
python3 - "$TMP/mixed.out" "$good" <<'EOF' || fail=1
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
want = json.loads(sys.argv[2])["text"]
ok = (len(lines) == 6 and lines[0] == want and lines[5] == want
      and all(isinstance(x, dict) and isinstance(x.get("error"), str) and x["error"] for x in lines[1:5]))
print("  " + ("errors in place" if ok else "unexpected output: %r" % lines))
sys.exit(0 if ok else 1)
EOF
[ "$rc" -eq 1 ] || { echo "FAIL: exit status $rc for bad lines (want 1)"; fail=1; }

# usage errors: one line on stderr, non-zero exit
if "$BIN" template -f "$TMP/mixed.in" > /dev/null 2> "$TMP/usage.err"; then
  echo "FAIL: no template given but exit 0"; fail=1
fi
[ "$(wc -l < "$TMP/usage.err")" -eq 1 ] || { echo "FAIL: usage error is not one line"; fail=1; }
if "$BIN" template -m "$TMP/does-not-exist" < /dev/null > /dev/null 2>&1; then
  echo "FAIL: missing folder but exit 0"; fail=1
fi

[ "$fail" -eq 0 ] && echo "test_template: all passed"
exit $fail
