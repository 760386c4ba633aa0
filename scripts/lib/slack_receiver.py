"""A local stand-in for Slack's incoming webhooks, for the demo: prints each
message as it would read in Slack (a compact text rendering of its blocks) and
appends its type to a log for the summary.

usage: slack_receiver.py PORT TYPES_LOG
"""
import http.server
import json
import sys

port, types_log = int(sys.argv[1]), sys.argv[2]


def render(message):
    lines = []
    for block in message.get("blocks", []):
        kind = block.get("type")
        if kind == "header":
            lines.append("▌" + block["text"]["text"])
        elif kind == "section":
            if "text" in block:
                lines.append(block["text"]["text"])
            fields = [f["text"].replace("*", "").replace("\n", ": ", 1) for f in block.get("fields", [])]
            if fields:
                lines.append(" | ".join(fields))
        elif kind == "context":
            lines.append(" ".join(e.get("text", "") for e in block.get("elements", [])))
        elif kind == "actions":
            lines.append(" ".join(f"[{b['text']['text']}]({b.get('url', '')})" for b in block.get("elements", [])))
    return "\n".join("  " + line for text in lines for line in text.splitlines())


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        message = json.loads(self.rfile.read(int(self.headers["content-length"])))
        print("\n[slack #training]\n" + render(message), flush=True)
        context = message["blocks"][-1]["elements"][0]["text"].split(" · ")
        with open(types_log, "a") as log:
            log.write(f"{context[1]} {context[2].split(' ')[0]}\n")
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
