"""A file server on loopback for tests/test_server_media_url.sh: python's http.server over a folder, plus paths
that misbehave. Prints its port on stdout, logs requests on stderr.
  /slow/NAME             NAME after 5 s
  /redirect/N/NAME       302 to /redirect/N-1/NAME, and /redirect/1/NAME to /NAME (N redirects)
  /redirect-to/PORT/NAME 302 to http://127.0.0.1:PORT/NAME
  /to-ftp                302 to an ftp URL
  /nolength/N            N bytes without a Content-Length (the end of the body is the end of the connection)
usage: media_server.py DIR [CERT.pem KEY.pem]   (with a certificate: https)"""
import functools, http.server, ssl, sys, time


class Handler(http.server.SimpleHTTPRequestHandler):
    def redirect(self, location):
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        parts = self.path.split("/")
        try:
            if parts[1] == "slow":
                time.sleep(5)
                self.path = "/" + "/".join(parts[2:])
            elif parts[1] == "redirect":
                n = int(parts[2])
                rest = "/".join(parts[3:])
                return self.redirect(f"/redirect/{n - 1}/{rest}" if n > 1 else "/" + rest)
            elif parts[1] == "redirect-to":
                return self.redirect(f"http://127.0.0.1:{parts[2]}/" + "/".join(parts[3:]))
            elif parts[1] == "to-ftp":
                return self.redirect("ftp://127.0.0.1/image0.png")
            elif parts[1] == "nolength":
                self.protocol_version = "HTTP/1.0"
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.end_headers()
                left = int(parts[2])
                while left > 0:
                    self.wfile.write(b"\0" * min(left, 65536))
                    left -= 65536
                self.close_connection = True
                return None
            return super().do_GET()
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout, a size limit)
            return None


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=sys.argv[1]))
server.daemon_threads = True
if len(sys.argv) > 3:
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(sys.argv[2], sys.argv[3])
    server.socket = tls.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
