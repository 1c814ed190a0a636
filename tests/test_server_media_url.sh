#!/bin/bash
# gemma4c serve fetching the http(s) URLs of image_url and audio_url parts (src/server/fetch.c), against a file
# server of python's http.server on loopback (tests/server/media_server.py) and a random gemma4_unified checkpoint
# (images and audio; tests/data/random_gemma4.py): a fetched image, image + audio, a redirect and a data URL
# whose base64 has line breaks give the greedy reply of the same bytes sent as data URLs; a 404, a body over
# --max-media-bytes (with and without Content-Length), a slow server (--media-fetch-timeout), too many redirects,
# a redirect to ftp, a closed port, an https server with a self-signed certificate, a body that is no image, and
# the schemes ftp, file and gopher are one-line 400s; a slow fetch does not hold another request;
# --allowed-media-domains refuses other hosts (on a redirect too) and --no-remote-media every URL; without
# --allow-private-media-hosts a loopback address (by number or name) is refused; the server answers after each and
# exits 0.
set -u
. "$G4_SOURCE_DIR/tests/server/common.sh" # check, start_server, stop_server
tmp=${G4_TMP:-/tmp}/server-media-url
rm -rf "$tmp"; mkdir -p "$tmp/www"
fx=$shared/fixtures/unified
cp "$fx/image0.png" "$fx/audio0.wav" "$tmp/www/"
head -c 300000 /dev/urandom >"$tmp/www/big.png"  # over --max-media-bytes below
echo "not an image" >"$tmp/www/text.png"
tar -xJf "$src/models/tolstoy-tiny.tar.xz" -C "$tmp" || { echo "cannot unpack the example model"; exit 1; }
"$py" "$src/tests/data/random_gemma4.py" unified "$fx/config.json" "$tmp/ru" --files-from "$tmp/tolstoy-tiny" >/dev/null
check $? "a random gemma4_unified checkpoint with the example's tokenizer"

"$py" "$src/tests/server/media_server.py" "$tmp/www" >"$tmp/files.port" 2>"$tmp/files.log" &
files_pid=$!
for i in $(seq 1 100); do [ -s "$tmp/files.port" ] && break; sleep 0.1; done
files_port=$(head -n 1 "$tmp/files.port")
[ -n "$files_port" ] || { echo "FAIL the file server did not start: $(tail -n 2 "$tmp/files.log")"; exit 1; }
trap 'kill $files_pid 2>/dev/null' EXIT
files=http://127.0.0.1:$files_port
# the same over https with a self-signed certificate, which the fetch must not trust
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$tmp/key.pem" -out "$tmp/cert.pem" -days 1 -subj /CN=127.0.0.1 \
    >/dev/null 2>&1
"$py" "$src/tests/server/media_server.py" "$tmp/www" "$tmp/cert.pem" "$tmp/key.pem" >"$tmp/tls.port" 2>"$tmp/tls.log" &
tls_pid=$!
for i in $(seq 1 100); do [ -s "$tmp/tls.port" ] && break; sleep 0.1; done
tls_port=$(head -n 1 "$tmp/tls.port")
[ -n "$tls_port" ] || { echo "FAIL the https file server did not start: $(tail -n 2 "$tmp/tls.log")"; exit 1; }
trap 'kill $files_pid $tls_pid 2>/dev/null' EXIT
closed_port=$("$py" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")

export no_proxy=127.0.0.1,localhost NO_PROXY=127.0.0.1,localhost # (libcurl honours proxy variables; these are local)
# ask PY_ARGS...: runs tests/server/media_client.py against the server (one line per request)
ask() { "$py" "$src/tests/server/media_client.py" "$SERVER_URL" "$tmp/www" "$@" </dev/null; }

# (the file servers are on loopback, which a server contacts only with --allow-private-media-hosts)
start_server "$tmp/serve1.log" -m "$tmp/ru" --quiet -t 2 --max-media-bytes 262144 --media-fetch-timeout 3 \
    --media-max-redirects 2 --allow-private-media-hosts
ask same "$files/image0.png" "$files/audio0.wav" "$files/redirect/2/image0.png" >"$tmp/same.txt"
grep -qx "ok image" "$tmp/same.txt"
check $? "a fetched image gives the data URL's reply ($(sed -n 1p "$tmp/same.txt"))"
grep -qx "ok image+audio" "$tmp/same.txt"
check $? "a fetched image and audio_url give the data URLs' reply ($(sed -n 2p "$tmp/same.txt"))"
grep -qx "ok redirect" "$tmp/same.txt"
check $? "an image behind 2 redirects gives the data URL's reply ($(sed -n 3p "$tmp/same.txt"))"
grep -qx "ok base64 lines" "$tmp/same.txt"
check $? "base64 in 76-column lines (image data URL and input_audio) gives the same reply ($(sed -n 4p "$tmp/same.txt"))"

# each: the URL, what the 400's message must hold
while IFS='|' read -r what url want; do
    got=$(ask error "$url")
    grep -q "^400 messages.content .*$want" <<<"$got"
    check $? "$what: 400 ($got)"
done <<EOF
a 404|$files/missing.png|HTTP 404
a body over --max-media-bytes|$files/big.png|larger than 262144 bytes
a body over --max-media-bytes without a Content-Length|$files/nolength/300000|larger than 262144 bytes
a server slower than --media-fetch-timeout|$files/slow/image0.png|timed out after 3 s
3 redirects beyond --media-max-redirects 2|$files/redirect/3/image0.png|more than 2 redirects
a redirect to ftp|$files/to-ftp|only http and https
a closed port|http://127.0.0.1:$closed_port/image0.png|onnect
a body that is no image|$files/text.png|image 1
an https server whose certificate is self-signed|https://127.0.0.1:$tls_port/image0.png|certificate
an ftp URL|ftp://127.0.0.1:$files_port/image0.png|scheme 'ftp'
a file URL|file:///etc/passwd|scheme 'file'
a gopher URL|gopher://127.0.0.1:$files_port/|scheme 'gopher'
EOF
got=$(ask concurrent "$files/slow/image0.png")
grep -q "^ok " <<<"$got"
check $? "a request beside a slow fetch is answered before the fetch ends ($got)"
got=$(ask same-image "$files/image0.png")
grep -q "^ok image" <<<"$got"
check $? "after all these, a fetched image still gives the data URL's reply ($got)"
stop_server

start_server "$tmp/serve2.log" -m "$tmp/ru" --quiet -t 2 --allowed-media-domains "example.org, LOCALHOST" \
    --allow-private-media-hosts
got=$(ask error "$files/image0.png")
grep -q "^400 messages.content .*host '127.0.0.1' is not in this server's --allowed-media-domains" <<<"$got"
check $? "--allowed-media-domains: a host not in the list is refused ($got)"
got=$(ask error "http://localhost:$files_port/redirect-to/$files_port/image0.png")
grep -q "^400 messages.content .*host '127.0.0.1' is not in" <<<"$got"
check $? "--allowed-media-domains: a redirect to a host not in the list is refused ($got)"
got=$(ask same-image "http://localhost:$files_port/image0.png")
grep -q "^ok image" <<<"$got"
check $? "--allowed-media-domains: a host in the list is fetched ($got)"
stop_server

start_server "$tmp/serve3.log" -m "$tmp/ru" --quiet -t 2 --no-remote-media
seen=$(grep -c '"GET /image0.png' "$tmp/files.log") # (a /slow/ request is logged when it ends, 5 s on)
got=$(ask error "$files/image0.png")
grep -q "^400 messages.content .*does not fetch remote media (--no-remote-media)" <<<"$got" &&
    [ "$(grep -c '"GET /image0.png' "$tmp/files.log")" = "$seen" ]
check $? "--no-remote-media: an http URL is refused, and not requested ($got)"
got=$(ask same-data)
grep -q "^ok " <<<"$got"
check $? "--no-remote-media: a data URL is still read ($got)"
stop_server

# by default only public addresses are contacted: loopback by address and by name is refused before a request
start_server "$tmp/serve4.log" -m "$tmp/ru" --quiet -t 2
seen=$(grep -c '"GET /image0.png' "$tmp/files.log")
got=$(ask error "$files/image0.png")
grep -q "^400 messages.content .*resolves to 127.0.0.1, which is not a public address" <<<"$got"
check $? "by default a loopback address is refused ($got)"
got=$(ask error "http://localhost:$files_port/image0.png")
grep -qE "^400 messages.content .*resolves to (127.0.0.1|::1), which is not a public address" <<<"$got" &&
    [ "$(grep -c '"GET /image0.png' "$tmp/files.log")" = "$seen" ]
check $? "by default localhost is refused, and nothing is requested ($got)"
stop_server

if grep -qiE "sanitizer|runtime error|leak" "$tmp"/serve*.log; then
    check 1 "sanitizer report: $(grep -m3 -iE 'sanitizer|runtime error|leak' "$tmp"/serve*.log)"
fi
kill $files_pid $tls_pid 2>/dev/null
rm -rf "$tmp"
exit $fail
