"""Prints every webhook the notifier delivers: its Standard Webhooks headers
and JSON body. The compose stack's stand-in for CI, a ticketing system or Slack."""

import json
from http.server import BaseHTTPRequestHandler, HTTPServer


class Sink(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            shown = json.dumps(json.loads(body), indent=2)
        except ValueError:
            shown = body.decode("utf-8", "replace")
        headers = {k: v for k, v in self.headers.items() if k.lower().startswith("webhook-")}
        print(f"{self.path} {headers}\n{shown}", flush=True)
        self.send_response(204)
        self.end_headers()

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok\n")

    def log_message(self, *args):
        pass


HTTPServer(("0.0.0.0", 8080), Sink).serve_forever()
