#!/bin/bash
# The library as users get it: `cmake --install` into a scratch prefix, then the C example of
# docs/api.md built outside the tree with pkg-config and the Python example run after
# `pip install ./python` (Debian's python3, in a venv, no network) must print exactly what
# `gemma4c run --temp 0` prints for a chat turn on the example model, which is transformers'
# greedy answer; then the Python package's own tests. In the sanitizer build the C example is
# built with the sanitizers (leaks fail it) and the Python part is skipped (an ASan library
# cannot be loaded into a plain python3).
set -u
bin=${G4_BIN:?}; src=${G4_SOURCE_DIR:?}; build=${G4_BUILD_DIR:?}; shared=${G4_SHARED_DIR:?}
tmp=${G4_TMP:-/tmp}/api_examples
py=${G4_PYTHON:-/usr/bin/python3}
. "$(cd "$(dirname "$0")" && pwd)/cli_check.sh" # check, expect_error

rm -rf "$tmp"; mkdir -p "$tmp"
tar -xJf "$src/models/tolstoy-tiny.tar.xz" -C "$tmp" || { echo "cannot unpack the example model"; exit 1; }
m=$tmp/tolstoy-tiny
user=$(python3 -c "import json; print(json.load(open('$m/reference.json'))['chat_user'])")

cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1
check $? "cmake --install into a scratch prefix"
pc=$(dirname "$(find "$tmp/prefix" -name gemma4c.pc | head -n 1)")
export PKG_CONFIG_PATH=$pc
libdir=$(pkg-config --variable=libdir gemma4c)
[ -f "$libdir/libgemma4c.so" ] && [ -f "$libdir/libgemma4c.a" ] && [ -f "$(pkg-config --variable=includedir gemma4c)/gemma4c.h" ]
check $? "gemma4c.pc points at the installed library and header ($libdir)"
"$tmp/prefix/bin/gemma4c" --version | grep -q "^gemma4c $(pkg-config --modversion gemma4c) "
check $? "the installed gemma4c runs on the installed library (version $(pkg-config --modversion gemma4c))"

# the examples, taken from the documentation itself
example() { awk -v tag="<!-- example: $1 -->" '$0 == tag {on = 1; next} on && /^```/ {if (inside) exit; inside = 1; next} inside' "$src/docs/api.md"; }
example chat.c >"$tmp/chat.c"; example chat.py >"$tmp/chat.py"
[ -s "$tmp/chat.c" ] && [ -s "$tmp/chat.py" ]; check $? "docs/api.md has the C and the Python example"

"$bin" run -m "$m" -p "$user" --temp 0 -n 48 >"$tmp/run.txt"
check $? "gemma4c run --temp 0 -n 48"
python3 - "$m/reference.json" "$tmp/run.txt" <<'PY'
import json, sys
want = json.load(open(sys.argv[1]))["chat_greedy_text"].strip()
sys.exit(0 if open(sys.argv[2], encoding="utf-8").read() == want + "\n" else 1)
PY
check $? "run prints transformers' greedy answer and a newline"

cc=${CC:-cc}
# shellcheck disable=SC2086,SC2046
$cc -std=c11 -Wall -Werror ${G4_EXAMPLE_CFLAGS:-} "$tmp/chat.c" -o "$tmp/chat" $(pkg-config --cflags --libs gemma4c) \
    -Wl,-rpath,"$libdir" 2>"$tmp/cc.log"
check $? "the C example builds outside the tree with pkg-config ($(cat "$tmp/cc.log" | head -c 300))"
"$tmp/chat" "$m" "$user" 48 >"$tmp/c.txt"
check $? "the C example runs"
cmp -s "$tmp/run.txt" "$tmp/c.txt"; check $? "the C example prints exactly what run prints"
# linked with libgemma4c.a and what `pkg-config --static --libs` lists besides, as docs/api.md says
# shellcheck disable=SC2086,SC2046
$cc -std=c11 -Wall -Werror ${G4_EXAMPLE_CFLAGS:-} "$tmp/chat.c" -o "$tmp/chat_static" $(pkg-config --cflags gemma4c) \
    "$libdir/libgemma4c.a" $(pkg-config --static --libs gemma4c | sed 's/-lgemma4c\b//') 2>"$tmp/cc_static.log"
check $? "the C example links libgemma4c.a with pkg-config --static ($(head -c 300 "$tmp/cc_static.log"))"
"$tmp/chat_static" "$m" "$user" 48 >"$tmp/c_static.txt" && cmp -s "$tmp/run.txt" "$tmp/c_static.txt"
check $? "the statically linked C example prints exactly what run prints"
# shellcheck disable=SC2046
$cc -std=c11 -Wall -Werror ${G4_EXAMPLE_CFLAGS:-} "$src/tests/abi_layout.c" -o "$tmp/abi_layout" \
    $(pkg-config --cflags --libs gemma4c) -Wl,-rpath,"$libdir" && "$tmp/abi_layout" >"$tmp/abi.json"
check $? "the struct layout printer builds and runs"

if [ -n "${G4_SANITIZE:-}" ]; then
    echo "sanitizer build: the Python part runs in the plain build"
    exit $fail
fi
if ! "$py" -m venv "$tmp/venv" >"$tmp/venv.log" 2>&1; then
    echo "FAIL $py -m venv (python3-venv is in scripts/debian-packages.txt): $(tail -n 1 "$tmp/venv.log")"
    exit 1
fi
PIP_DISABLE_PIP_VERSION_CHECK=1 "$tmp/venv/bin/pip" install -q --no-index "$src/python" >"$tmp/pip.log" 2>&1
check $? "pip install ./python (Debian's python3, no network)$(tail -n 3 "$tmp/pip.log" | tr '\n' ' ')"
export LD_LIBRARY_PATH=$libdir
"$tmp/venv/bin/python" "$tmp/chat.py" "$m" "$user" 48 >"$tmp/py.txt"
check $? "the Python example runs"
cmp -s "$tmp/run.txt" "$tmp/py.txt"; check $? "the Python example prints exactly what run prints"
version=$(sed -n 's/^#define G4_VERSION "\(.*\)"/\1/p' "$src/include/gemma4c.h")
(cd "$tmp" && "$tmp/venv/bin/python" "$src/python/tests/test_gemma4c.py" "$m" "$shared/fixtures/dense-ple" \
    "$tmp/abi.json" "$version")
check $? "the Python package's tests"
exit $fail
