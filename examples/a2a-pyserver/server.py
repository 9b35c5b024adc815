"""An Agent2Agent (A2A 0.3) agent in Python's standard library, written from
the A2A specification as an independent server for turncheck to check.

- Agent card at /.well-known/agent-card.json; JSON-RPC 2.0 at /a2a:
  message/send, message/stream (SSE), tasks/get, tasks/cancel.
- The agent names each context (a message without contextId starts one);
  every message is a task of its own in its context.
- A task calls the model at --model-url (OpenAI chat completions) with the
  context's committed history plus its user message, and commits both
  messages only when it completes. A failed, cancelled or dropped task
  commits nothing; its model call is abandoned (the connection closed).
- One task at a time per context: a later one waits (at most
  --queue-wait seconds, then it is rejected).
- Committed history is written atomically to --data-dir (one JSON file per
  context) and read back at start.

Bug switches for checking the checker (env A2A_BUG or --bug, comma-separated):
  ignore-cancel        tasks/cancel answers canceled, the task runs on and commits
  run-on-after-drop    a dropped connection does not stop its task
  rerun-finished-task  a message naming a finished task runs its message again
A2A_LOG=FILE also appends the server's log lines to FILE.

    turncheck conform --profile examples/a2a-pyserver/profile.yaml
"""
import argparse
import datetime
import http.client
import json
import os
import select
import signal
import socket
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TERMINAL = ("completed", "failed", "canceled", "rejected")
RPC_PATH = "/a2a"
MAX_BODY = 1 << 20

# JSON-RPC 2.0 and A2A error codes.
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL = -32700, -32600, -32601, -32602, -32603
TASK_NOT_FOUND, TASK_NOT_CANCELABLE, PUSH_UNSUPPORTED, UNSUPPORTED_OP = -32001, -32002, -32003, -32004
EXT_CARD_NOT_CONFIGURED = -32007

args = None
BUGS = set()


LOG_FILE = os.environ.get("A2A_LOG")  # also append the log to this file, if set


def log(*a):
    line = " ".join([time.strftime("%H:%M:%S")] + [str(x) for x in a])
    print(line, file=sys.stderr, flush=True)
    if LOG_FILE:
        with open(LOG_FILE, "a") as f:
            f.write("%d %s\n" % (os.getpid(), line))


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


class RPCError(Exception):
    def __init__(self, code, message, data=None):
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


# ---------------------------------------------------------------- storage

class Context:
    def __init__(self, cid, owner, history=None):
        self.id = cid
        self.owner = owner              # the API key it belongs to ("" without keys)
        self.history = history or []    # committed A2A messages, user and agent, in order
        self.lock = threading.Lock()    # held by the one task of the context that runs


contexts, tasks, registry = {}, {}, threading.Lock()


def context_path(cid):
    return os.path.join(args.data_dir, "contexts", cid + ".json")


def persist(ctx, history):
    """Write a context's committed history atomically: temp file, fsync, rename, fsync dir."""
    d = os.path.dirname(context_path(ctx.id))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=d)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"contextId": ctx.id, "owner": ctx.owner, "history": history}, f)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, context_path(ctx.id))
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def load_contexts():
    d = os.path.join(args.data_dir, "contexts")
    os.makedirs(d, exist_ok=True)
    for name in os.listdir(d):
        if not name.endswith(".json") or name.startswith("."):
            continue
        with open(os.path.join(d, name)) as f:
            rec = json.load(f)
        contexts[rec["contextId"]] = Context(rec["contextId"], rec.get("owner", ""), rec["history"])
    log("loaded %d context(s)" % len(contexts))


# ---------------------------------------------------------------- tasks

class Task:
    def __init__(self, ctx, user_msg):
        self.id = str(uuid.uuid4())
        self.ctx = ctx
        self.user_msg = user_msg
        self.state = "submitted"
        self.status_msg = None
        self.agent_msg = None
        self.artifacts = []
        self.events = []                 # stream events, in order
        self.cond = threading.Condition()  # guards everything above and below
        self.cancel_requested = False
        self.model_conn = None
        self.abort_reason = None
        self.events.append(self.snapshot())

    # all of these are called with self.cond held, except snapshot at init
    def add_event(self, ev):
        self.events.append(ev)
        self.cond.notify_all()

    def status(self):
        st = {"state": self.state, "timestamp": now()}
        if self.status_msg is not None:
            st["message"] = self.status_msg
        return st

    def snapshot(self, history_length=None):
        hist = [self.user_msg] + ([self.agent_msg] if self.agent_msg else [])
        if history_length is not None:
            hist = hist[-history_length:] if history_length > 0 else []
        t = {"kind": "task", "id": self.id, "contextId": self.ctx.id, "status": self.status(), "history": hist}
        if self.artifacts:
            t["artifacts"] = self.artifacts
        return t

    def set_state(self, state, text=None, final=False):
        self.state = state
        if text is not None:
            self.status_msg = agent_message(self.ctx.id, self.id, text)
        self.add_event({"kind": "status-update", "taskId": self.id, "contextId": self.ctx.id,
                        "status": self.status(), "final": final})

    def abort_model(self, reason):
        """Abandon the model call in flight, if any: shut its connection down."""
        self.abort_reason = self.abort_reason or reason
        conn = self.model_conn
        if conn is not None and conn.sock is not None:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cancel(self, why):
        """Cancel the task (tasks/cancel, or its client went away). Returns False if it had ended."""
        with self.cond:
            if self.state in TERMINAL:
                return False
            if "ignore-cancel" in BUGS and why == "tasks/cancel":
                # BUG: the answer says canceled, the executor never hears of it.
                self.set_state("canceled", "the task was canceled", final=True)
                return True
            self.cancel_requested = True
            self.abort_model(why)
            self.set_state("canceled", "the task was canceled (%s)" % why, final=True)
            log("task %s canceled: %s" % (self.id[:8], why))
            return True


def agent_message(cid, tid, text):
    return {"kind": "message", "role": "agent", "messageId": str(uuid.uuid4()),
            "parts": [{"kind": "text", "text": text}], "contextId": cid, "taskId": tid}


def message_text(msg):
    return "\n".join(p.get("text", "") for p in msg.get("parts", [])
                     if isinstance(p, dict) and p.get("kind") == "text" and isinstance(p.get("text"), str))


def call_model(task, messages):
    """One chat-completions call, abandoned on cancel and after --model-timeout seconds."""
    u = urllib.parse.urlsplit(args.model_url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=args.model_timeout)
    with task.cond:
        if task.cancel_requested:
            raise RuntimeError("canceled before the model call")
        task.model_conn = conn
    timer = threading.Timer(args.model_timeout, task.abort_model, ("model timeout",))
    timer.start()
    try:
        conn.connect()
        with task.cond:
            if task.cancel_requested or task.abort_reason:
                raise RuntimeError("aborted: %s" % task.abort_reason)
        body = json.dumps({"model": args.model, "messages": messages, "stream": False}).encode()
        conn.request("POST", u.path.rstrip("/") + "/chat/completions", body=body,
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if task.abort_reason:
            raise RuntimeError("aborted: %s" % task.abort_reason)
        if resp.status != 200:
            raise RuntimeError("the model answered %d: %s" % (resp.status, data[:200]))
        content = json.loads(data)["choices"][0]["message"]["content"]
        if not isinstance(content, str) or not content:
            raise RuntimeError("the model gave no text")
        return content
    except Exception as e:
        if task.abort_reason:
            raise RuntimeError("aborted: %s" % task.abort_reason) from e
        raise
    finally:
        timer.cancel()
        conn.close()
        with task.cond:
            task.model_conn = None


def to_chat(msgs):
    return [{"role": "user" if m["role"] == "user" else "assistant", "content": message_text(m)} for m in msgs]


def run_task(task):
    ctx = task.ctx
    deadline = time.monotonic() + args.queue_wait
    got = False
    while not got:  # wait for the context's running task to end, or give up
        with task.cond:
            if task.cancel_requested:  # canceled while queued
                return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            with task.cond:
                if task.state not in TERMINAL:
                    task.set_state("rejected", "the context is busy with another task", final=True)
            return
        got = ctx.lock.acquire(timeout=min(0.05, remaining))
    try:
        with task.cond:
            if task.cancel_requested:
                return
            if task.state not in TERMINAL:
                task.set_state("working")
        base = list(ctx.history)
        try:
            reply = call_model(task, to_chat(base + [task.user_msg]))
        except Exception as e:
            with task.cond:
                if task.state not in TERMINAL:
                    task.set_state("failed", "the model failed: %s" % e, final=True)
            log("task %s: no commit (%s)" % (task.id[:8], e))
            return
        with task.cond:
            ignored = "ignore-cancel" in BUGS and task.state == "canceled" and not task.cancel_requested
            if task.cancel_requested or (task.state in TERMINAL and not ignored):
                return
            amsg = agent_message(ctx.id, task.id, reply)
            new = base + [task.user_msg, amsg]
            try:
                persist(ctx, new)
            except Exception as e:
                if not ignored:
                    task.set_state("failed", "could not store the context: %s" % e, final=True)
                return
            ctx.history = new
            log("task %s committed to %s (%d messages)" % (task.id[:8], ctx.id[:8], len(new)))
            if ignored:
                return
            task.agent_msg = amsg
            art = {"artifactId": str(uuid.uuid4()), "name": "reply", "parts": [{"kind": "text", "text": reply}]}
            task.artifacts = [art]
            task.add_event({"kind": "artifact-update", "taskId": task.id, "contextId": ctx.id,
                            "artifact": art, "append": False, "lastChunk": True})
            task.state = "completed"
            task.status_msg = amsg
            task.add_event({"kind": "status-update", "taskId": task.id, "contextId": ctx.id,
                            "status": task.status(), "final": True})
    finally:
        ctx.lock.release()


# ---------------------------------------------------------------- JSON-RPC

def check_message(params):
    if not isinstance(params, dict):
        raise RPCError(INVALID_PARAMS, "params must be an object")
    msg = params.get("message")
    if not isinstance(msg, dict):
        raise RPCError(INVALID_PARAMS, "params.message is required")
    if msg.get("kind", "message") != "message" or msg.get("role") != "user":
        raise RPCError(INVALID_PARAMS, "message must be a user message")
    if not isinstance(msg.get("messageId"), str) or not msg["messageId"]:
        raise RPCError(INVALID_PARAMS, "message.messageId is required")
    parts = msg.get("parts")
    if not isinstance(parts, list):
        raise RPCError(INVALID_PARAMS, "message.parts must be an array")
    if not message_text(msg).strip():
        raise RPCError(INVALID_PARAMS, "the message has no text")
    for k in ("contextId", "taskId"):
        if k in msg and msg[k] is not None and not isinstance(msg[k], str):
            raise RPCError(INVALID_PARAMS, "message.%s must be a string" % k)
    cfg = params.get("configuration") or {}
    if not isinstance(cfg, dict):
        raise RPCError(INVALID_PARAMS, "configuration must be an object")
    return msg, cfg


def start_task(params, key):
    msg, cfg = check_message(params)
    cid, tid = msg.get("contextId"), msg.get("taskId")
    with registry:
        if tid:
            old = tasks.get(tid)
            if old is None or old.ctx.owner != key:
                raise RPCError(TASK_NOT_FOUND, "task not found")
            if cid and cid != old.ctx.id:
                raise RPCError(INVALID_PARAMS, "the task is not of that context")
            if old.state not in TERMINAL:
                raise RPCError(UNSUPPORTED_OP, "the task is still running; it takes no further message")
            if "rerun-finished-task" not in BUGS:
                raise RPCError(UNSUPPORTED_OP, "task %s is %s: a task in a terminal state does not restart;"
                               " send a new message in its context" % (tid, old.state))
            # BUG: run the finished task's message again on the context as it is.
            ctx, msg = old.ctx, old.user_msg
        elif cid:
            ctx = contexts.get(cid)
            if ctx is None or ctx.owner != key:
                raise RPCError(INVALID_PARAMS, "context not found: %s" % cid)
        else:
            ctx = Context(str(uuid.uuid4()), key)
            contexts[ctx.id] = ctx
        user = dict(msg, contextId=ctx.id)
        task = Task(ctx, user)
        user["taskId"] = task.id
        tasks[task.id] = task
    log("task %s on context %s" % (task.id[:8], ctx.id[:8]))
    threading.Thread(target=run_task, args=(task,), daemon=True).start()
    return task, cfg


def find_task(params, key):
    if not isinstance(params, dict) or not isinstance(params.get("id"), str):
        raise RPCError(INVALID_PARAMS, "params.id is required")
    with registry:
        t = tasks.get(params["id"])
    if t is None or t.ctx.owner != key:
        raise RPCError(TASK_NOT_FOUND, "task not found")
    return t


def history_length(params):
    n = params.get("historyLength") if isinstance(params, dict) else None
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 0):
        raise RPCError(INVALID_PARAMS, "historyLength must be a non-negative integer")
    return n


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send_body(self, status, obj, ctype="application/json"):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        path = urllib.parse.urlsplit(self.path).path
        if path in ("/.well-known/agent-card.json", "/.well-known/agent.json"):
            return self.send_body(200, agent_card(self.server.server_address))
        if path == "/healthz":
            return self.send_body(200, {"ok": True})
        self.send_body(404, {"error": "not found"})

    def client_gone(self):
        """True once the client has closed its connection (an EOF is readable)."""
        try:
            r, _, _ = select.select([self.connection], [], [], 0)
            if not r:
                return False
            return self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def rpc_result(self, rid, result):
        return {"jsonrpc": "2.0", "id": rid, "result": result}

    def rpc_error(self, rid, e):
        err = {"code": e.code, "message": e.message}
        if e.data is not None:
            err["data"] = e.data
        return {"jsonrpc": "2.0", "id": rid, "error": err}

    def do_POST(self):
        if urllib.parse.urlsplit(self.path).path != RPC_PATH:
            return self.send_body(404, {"error": "not found"})
        key = ""
        if args.key:
            auth = self.headers.get("Authorization", "")
            key = auth[7:] if auth.startswith("Bearer ") else ""
            if key not in args.key:
                return self.send_body(401, self.rpc_error(None, RPCError(INVALID_REQUEST, "unauthorized")))
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            self.close_connection = True
            return self.send_body(413, self.rpc_error(None, RPCError(INVALID_REQUEST, "request too large")))
        raw = self.rfile.read(n)
        rid = None
        try:
            try:
                req = json.loads(raw)
            except ValueError:
                raise RPCError(PARSE_ERROR, "parse error")
            if not isinstance(req, dict):
                raise RPCError(INVALID_REQUEST, "the request must be a JSON-RPC 2.0 request object")
            rid = req.get("id")
            if not isinstance(rid, (str, int)) or isinstance(rid, bool):
                rid = None
                raise RPCError(INVALID_REQUEST, "a request needs a string or number id")
            if req.get("jsonrpc") != "2.0" or not isinstance(req.get("method"), str):
                raise RPCError(INVALID_REQUEST, "not a JSON-RPC 2.0 request")
            method, params = req["method"], req.get("params")
            if method == "message/stream":
                return self.stream(rid, params, key)
            if method == "message/send":
                return self.send_body(200, self.rpc_result(rid, self.message_send(params, key)))
            if method == "tasks/get":
                n = history_length(params)
                t = find_task(params, key)
                with t.cond:
                    return self.send_body(200, self.rpc_result(rid, t.snapshot(n)))
            if method == "tasks/cancel":
                t = find_task(params, key)
                if not t.cancel("tasks/cancel"):
                    raise RPCError(TASK_NOT_CANCELABLE, "task is %s: not cancelable" % t.state)
                with t.cond:
                    return self.send_body(200, self.rpc_result(rid, t.snapshot()))
            if method == "tasks/resubscribe":
                raise RPCError(UNSUPPORTED_OP, "tasks/resubscribe is not supported")
            if method.startswith("tasks/pushNotificationConfig/"):
                raise RPCError(PUSH_UNSUPPORTED, "push notifications are not supported")
            if method == "agent/getAuthenticatedExtendedCard":
                raise RPCError(EXT_CARD_NOT_CONFIGURED, "no extended agent card")
            raise RPCError(METHOD_NOT_FOUND, "method not found: %s" % method)
        except RPCError as e:
            return self.send_body(200, self.rpc_error(rid, e))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:  # a bug of ours: say so rather than drop the connection
            log("internal error: %r" % e)
            self.close_connection = True
            try:
                return self.send_body(200, self.rpc_error(rid, RPCError(INTERNAL, "internal error")))
            except OSError:
                pass

    def wait_end(self, task):
        """Wait for the task to end; cancel it if the client goes away. False if it went."""
        while True:
            with task.cond:
                if task.state in TERMINAL:
                    return True
                task.cond.wait(0.05)
                if task.state in TERMINAL:
                    return True
            if self.client_gone():
                self.on_drop(task)
                return False

    def on_drop(self, task):
        self.close_connection = True
        if "run-on-after-drop" in BUGS:
            log("task %s: client gone, running on (bug)" % task.id[:8])
            return
        task.cancel("client disconnected")

    def message_send(self, params, key):
        task, cfg = start_task(params, key)
        n = history_length(cfg)
        if cfg.get("blocking", True) is not False:
            if not self.wait_end(task):
                raise ConnectionResetError()
        with task.cond:
            return task.snapshot(n)

    def stream(self, rid, params, key):
        task, _ = start_task(params, key)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        sent = 0
        try:
            while True:
                with task.cond:
                    if sent == len(task.events) and task.state not in TERMINAL:
                        task.cond.wait(0.05)
                    evs = task.events[sent:]
                    done = task.state in TERMINAL
                for ev in evs:
                    self.wfile.write(b"data: " + json.dumps(self.rpc_result(rid, ev)).encode() + b"\n\n")
                sent += len(evs)
                if done and sent == len(task.events):
                    return
                if self.client_gone():
                    return self.on_drop(task)
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.on_drop(task)


def agent_card(addr):
    card = {
        "protocolVersion": "0.3.0",
        "name": "a2a-pyserver",
        "description": "A chat agent that keeps each context's history, for turncheck.",
        "url": "http://%s:%d%s" % (addr[0], addr[1], RPC_PATH),
        "preferredTransport": "JSONRPC",
        "version": "1.0.0",
        "capabilities": {"streaming": True, "pushNotifications": False, "stateTransitionHistory": False},
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"],
        "skills": [{"id": "chat", "name": "chat", "description": "Answers in a conversation.", "tags": ["chat"]}],
    }
    if args.key:
        card["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        card["security"] = [{"bearer": []}]
    return card


def main():
    global args
    p = argparse.ArgumentParser()
    p.add_argument("--listen", default="127.0.0.1:0")
    p.add_argument("--model-url", required=True, help="OpenAI-compatible base URL, ending in /v1")
    p.add_argument("--model", default="turncheck")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--key", action="append", default=[], help="an accepted bearer key (repeatable)")
    p.add_argument("--model-timeout", type=float, default=2.0)
    p.add_argument("--queue-wait", type=float, default=8.0, help="longest wait behind a context's running task")
    p.add_argument("--bug", default=os.environ.get("A2A_BUG", ""))
    args = p.parse_args()
    BUGS.update(b for b in args.bug.split(",") if b)
    unknown = BUGS - {"ignore-cancel", "run-on-after-drop", "rerun-finished-task"}
    if unknown:
        p.error("unknown bug(s): %s" % ", ".join(sorted(unknown)))
    load_contexts()
    host, port = args.listen.rsplit(":", 1)
    srv = ThreadingHTTPServer((host, int(port)), Handler)
    srv.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
    if BUGS:
        log("bugs on: %s" % ", ".join(sorted(BUGS)))
    print("listening on http://%s:%d" % srv.server_address[:2], flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
