"""A session server in under 100 lines of Python's standard library: turncheck's
walkthrough example. It keeps each conversation's history in memory under
the X-Conversation-Id header, calls the model at --model-url for every
turn, and commits a turn only when the model answered. Check it with:

    turncheck conform --profile examples/pyserver/profile.yaml
"""
import argparse, json, sys, threading, urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

history, locks, guard = {}, {}, threading.Lock()


def lock_for(conv):
    with guard:
        return locks.setdefault(conv, threading.Lock())


class Chat(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def send_json(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def error(self, status, message, kind):
        self.send_json(status, {"error": {"message": message, "type": kind}})

    def do_POST(self):
        if self.path != "/v1/chat/completions":
            return self.error(404, "not found", "not_found")
        try:
            req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            msgs = req["messages"]
        except (ValueError, KeyError, TypeError):
            return self.error(400, "malformed request", "invalid_request_error")
        last = msgs[-1] if isinstance(msgs, list) and msgs else {}
        if not isinstance(last, dict) or last.get("role") != "user" or not str(last.get("content") or "").strip():
            return self.error(400, "no new user message", "invalid_request_error")
        conv = self.headers.get("X-Conversation-Id", "")
        with lock_for(conv):  # one turn at a time per conversation
            turn = history.get(conv, []) + [{"role": "user", "content": last["content"]}]
            try:
                call = urllib.request.Request(args.model_url + "/chat/completions", method="POST",
                                              data=json.dumps({"model": req.get("model"), "messages": turn}).encode(),
                                              headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(call, timeout=2) as r:
                    reply = json.load(r)["choices"][0]["message"]["content"]
            except Exception as e:  # the model failed: nothing is committed
                return self.error(502, "the model failed: %s" % e, "upstream_error")
            if conv:
                history[conv] = turn + [{"role": "assistant", "content": reply}]
        if not req.get("stream"):
            return self.send_json(200, {"object": "chat.completion", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}]})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for delta, finish in (({"role": "assistant", "content": reply}, None), ({}, "stop")):
            chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")
        self.close_connection = True

    def log_message(self, *a):
        pass


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--listen", default="127.0.0.1:0")
    p.add_argument("--model-url", required=True)
    args = p.parse_args()
    host, port = args.listen.rsplit(":", 1)
    srv = ThreadingHTTPServer((host, int(port)), Chat)
    print("listening on http://%s:%d" % srv.server_address[:2], flush=True)
    srv.serve_forever()
