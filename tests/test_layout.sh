#!/bin/bash
# The library's shape: the CLI and the server are built on the public header alone (no file of
# src/cli/ or src/server/ includes an internal header; the CLI reaches the server through
# server/server.h), and libgemma4c.so exports exactly the functions gemma4c.h declares with G4_API.
set -u
src=${G4_SOURCE_DIR:?}; lib=${G4_LIB:?}
. "$(cd "$(dirname "$0")" && pwd)/cli_check.sh" # check, expect_error

# quoted includes of src/cli may name gemma4c.h or the CLI's own headers, nothing else
bad=$(grep -HnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$src"/src/cli/*.[ch] |
      grep -vE '#[[:space:]]*include[[:space:]]*"(gemma4c\.h|cli/[a-z_]+\.h|server/server\.h)"')
[ -z "$bad" ]; check $? "src/cli includes only gemma4c.h and its own headers${bad:+: $bad}"
# and angle-bracket includes name system headers only (not the project's folders)
bad=$(grep -HnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*<(core|formats|model|backend|engine|tokenizer|jinja|chat|towers|server)/' "$src"/src/cli/*.[ch])
[ -z "$bad" ]; check $? "src/cli reaches no internal header with <...>${bad:+: $bad}"

bad=$(grep -HnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$src"/src/server/*.[ch] |
      grep -vE '#[[:space:]]*include[[:space:]]*"(gemma4c\.h|server/[a-z_]+\.h)"')
[ -z "$bad" ]; check $? "src/server includes only gemma4c.h and its own headers${bad:+: $bad}"
bad=$(grep -HnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*<(core|formats|model|backend|engine|tokenizer|jinja|chat|towers|cli)/' "$src"/src/server/*.[ch])
[ -z "$bad" ]; check $? "src/server reaches no internal header with <...>${bad:+: $bad}"

declared=$(sed -n 's/^G4_API .*[ *]\(g4_[a-z0-9_]*\)(.*/\1/p' "$src/include/gemma4c.h" | sort)
exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TW]$/ {print $3}' | sort)
[ -n "$declared" ] && [ "$declared" = "$exported" ]
check $? "libgemma4c.so exports exactly the $(echo "$declared" | wc -l) G4_API functions$(diff <(echo "$declared") <(echo "$exported") | grep '^[<>]' | tr '\n' ' ')"
exit $fail
