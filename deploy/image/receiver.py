"""A webhook receiver on loopback for deploy/image/test.

Listens on 127.0.0.1 on a free port, writes that port to PORT_FILE, appends each request it
receives to LOG_FILE as one JSON line (method, path, headers, body in base64), and answers
200. Stops on SIGTERM.

    python3 receiver.py PORT_FILE LOG_FILE
"""

import base64
import json
import os
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT_FILE, LOG_FILE = sys.argv[1], sys.argv[2]


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        record = {
            "method": self.command,
            "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body": base64.b64encode(body).decode(),
        }
        with open(LOG_FILE, "a", encoding="utf-8") as log:
            log.write(json.dumps(record) + "\n")
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        sys.stderr.write("receiver: " + (format % args) + "\n")


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
tmp = PORT_FILE + ".tmp"
with open(tmp, "w", encoding="utf-8") as f:
    f.write(str(server.server_address[1]))
os.replace(tmp, PORT_FILE)
server.serve_forever()
