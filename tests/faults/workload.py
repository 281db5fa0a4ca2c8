"""The workload: buyers who join, stream (SSE) or poll, leave and rejoin,
order with their token (the demo order service and the token API), let
tokens lapse, go silent (abandon), and meet a lottery opening. Each buyer
is a thread; each stream has its own reader thread. Every request, answer
and event goes into the history."""

import base64
import http.client
import json
import random
import secrets
import threading
import time

KEEP = ("ticket", "status", "rank", "totalWaiting", "entryToken", "tokenExpiresInSeconds", "error",
        "admittedAt", "reason", "claimId", "orderId", "quantity", "productId", "userId",
        "queue", "stock", "state", "opensAt")
PRODUCT = "fault-stock"


def ticket_entry(ticket):
    """The entry (arrival sequence) a ticket is for: its payload is
    `queue\\nuser\\nentry\\nexpires` in URL-safe base64."""
    try:
        payload = ticket.split(".")[0]
        raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).decode()
        return int(raw.split("\n")[2])
    except Exception:
        return None


def slim(body):
    if isinstance(body, dict):
        return {k: body[k] for k in KEEP if k in body}
    return body


class Client:
    """HTTP against the instances: a fresh connection per request, so a
    killed or stopped instance costs one request, not a pool."""

    def __init__(self, cluster, history, rng_seed):
        self.cluster, self.h = cluster, history
        self.rng = random.Random(rng_seed)

    def call(self, op, inst, method, path, *, headers=None, body=None, admin=False,
             timeout=5.0, **fields):
        port = inst.admin_port if admin else inst.port
        t0, w0 = self.h.now()
        rec = {"op": op, "inst": inst.idx, "t0": round(t0, 4), "w0": w0, **fields}
        data = json.dumps(body).encode() if body is not None else None
        hdrs = dict(headers or {})
        if data is not None:
            hdrs["Content-Type"] = "application/json"
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
            conn.request(method, path, body=data, headers=hdrs)
            resp = conn.getresponse()
            raw = resp.read()
            conn.close()
            rec["code"] = resp.status
            try:
                parsed = json.loads(raw) if raw else None
            except ValueError:
                parsed = None
            rec["body"] = slim(parsed)
        except Exception as e:  # refused, reset, timed out: the op's outcome is unknown
            rec["code"] = None
            rec["err"] = type(e).__name__
            parsed = None
        self.h.record(rec)
        return rec.get("code"), parsed


class Workload:
    def __init__(self, cluster, history, seed, settings, deadline, buyers):
        self.cluster, self.h, self.s = cluster, history, settings
        self.seed, self.deadline, self.n_buyers = seed, deadline, buyers
        self.rng = random.Random(seed ^ 0x5eed)
        self.lock = threading.Lock()
        self.next_user = 0
        self.streams = {}  # (queue, user, entry) -> Stream, open streams
        self.places = {}  # (queue, user, entry) -> ticket, every acknowledged place
        self.queues = ["default"]
        self.lottery_queue = None  # (name, opens_at_ms)
        self.stop = threading.Event()
        self.threads = []

    # -- set-up -----------------------------------------------------------
    def admin_headers(self):
        return {"Authorization": f"Bearer {self.s['admin_token']}"}

    def svc_headers(self):
        return {"Authorization": f"Bearer {self.s['service_token']}"}

    def any_instance(self, rng):
        live = [i for i in self.cluster.instances if i.alive()]
        return rng.choice(live or self.cluster.instances)

    def admin_call(self, client, op, method, path, body=None, attempts=20, ok=(200, 201),
                   **fields):
        for _ in range(attempts):
            code, parsed = client.call(op, self.any_instance(client.rng), method, path,
                                       headers=self.admin_headers(), body=body, admin=True,
                                       **fields)
            if code in ok:
                return code, parsed
            time.sleep(0.5)
        return code, parsed

    def set_stock(self, client, stock):
        return self.admin_call(client, "restock", "PUT", f"/api/admin/products/{PRODUCT}",
                               {"name": "Fault stock", "queue": "default", "priceCents": 100,
                                "stock": stock, "maxPerOrder": 2}, product=PRODUCT, stock=stock)

    def open_lottery(self, client, name, opens_in_s):
        code, _ = self.admin_call(client, "open_queue", "PUT", f"/api/admin/queues/{name}", {},
                                  q=name)
        if code not in (200, 201):
            return
        time.sleep(1.2)  # every instance re-reads the registry each second
        opens_at = int(time.time() * 1000 + opens_in_s * 1000)
        code, _ = self.admin_call(client, "schedule_lottery", "PUT",
                                  f"/api/admin/queues/{name}/lottery", {"opensAt": opens_at},
                                  q=name, opensAt=opens_at)
        if code == 200:
            with self.lock:
                self.queues.append(name)
                self.lottery_queue = (name, opens_at)

    # -- running ----------------------------------------------------------
    def start(self):
        admin = Client(self.cluster, self.h, self.seed)
        self.set_stock(admin, self.s["stock"])
        for i in range(self.n_buyers):
            th = threading.Thread(target=self.buyer_loop, args=(i,), daemon=True)
            th.start()
            self.threads.append(th)
        th = threading.Thread(target=self.operator_loop, args=(admin,), daemon=True)
        th.start()
        self.threads.append(th)

    def operator_loop(self, admin):
        """Lottery openings and restocks, at seeded times."""
        rng = random.Random(self.seed ^ 0x1077)
        n = 0
        next_lottery = time.monotonic() + rng.uniform(3, 8)
        next_stock = time.monotonic() + 45
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            now = time.monotonic()
            if now >= next_lottery:
                n += 1
                self.open_lottery(admin, f"drop{n}", rng.uniform(8, 15))
                next_lottery = now + rng.uniform(60, 120)
            if now >= next_stock:
                # Who reads the stock at 0 sees sold out; a restock opens it again.
                admin.call("products", self.any_instance(rng), "GET", "/api/products")
                self.set_stock(admin, self.s["stock"])
                next_stock = now + 45
            self.stop.wait(0.5)

    def join_stop(self, timeout):
        self.stop.set()
        for s in list(self.streams.values()):
            s.close()
        end = time.monotonic() + timeout
        for th in self.threads:
            th.join(timeout=max(0.1, end - time.monotonic()))

    def probe_streams(self, heal_t):
        """After a heal: the store's state of every buyer whose stream is
        open, read with a poll (what the stream must come to show)."""
        client = Client(self.cluster, self.h, self.seed ^ int(heal_t * 1000))
        with self.lock:
            keys = list(self.streams.items())
        for (q, user, entry), stream in keys:
            if stream.closed.is_set():
                continue
            client.call("probe", self.any_instance(client.rng), "GET",
                        f"/api/queues/{q}/position",
                        headers={"X-User-Id": user, "X-Queue-Ticket": stream.b.ticket},
                        buyer=user, q=q, entry=entry, heal=round(heal_t, 4))

    def final_sweep(self):
        """Every place ever acknowledged, read once more after the last
        heal: what the durability check compares with what was promised."""
        from concurrent.futures import ThreadPoolExecutor
        with self.lock:
            places = list(self.places.items())
        clients = [Client(self.cluster, self.h, self.seed ^ (0xf1 + k)) for k in range(8)]

        def one(args):
            k, ((q, user, entry), ticket) = args
            c = clients[k % 8]
            for _ in range(5):
                code, _ = c.call("final", self.any_instance(c.rng), "GET",
                                 f"/api/queues/{q}/position",
                                 headers={"X-User-Id": user, "X-Queue-Ticket": ticket},
                                 buyer=user, q=q, entry=entry)
                if code in (200, 401):
                    return
                time.sleep(0.3)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, enumerate(places)))

    def buyer_loop(self, i):
        rng = random.Random(self.seed * 1000 + i)
        client = Client(self.cluster, self.h, self.seed * 1000 + i)
        time.sleep(rng.uniform(0, 2))
        while not self.stop.is_set() and time.monotonic() < self.deadline - 2:
            with self.lock:
                self.next_user += 1
                user = f"b{self.next_user:06d}"
                queues = list(self.queues)
                lot = self.lottery_queue
            queue = "default"
            if lot and rng.random() < 0.35 and lot[1] > time.time() * 1000 - 20000:
                queue = lot[0]
            try:
                Buyer(self, client, rng, user, queue).live()
            except Exception as e:  # a harness bug must not pass silently
                self.h.record({"op": "harness_error", "buyer": user, "err": repr(e)})
                raise
            time.sleep(rng.uniform(0, 0.5))
        del queues


class Buyer:
    """One buyer's life: join, wait, maybe leave and rejoin, then use or
    lose the token."""

    def __init__(self, w, client, rng, user, queue):
        self.w, self.c, self.rng, self.user, self.q = w, client, rng, user, queue
        self.ticket = self.entry = None
        self.stream = None
        self.token = None

    def hdr(self, **extra):
        h = {"X-User-Id": self.user}
        if self.ticket:
            h["X-Queue-Ticket"] = self.ticket
        h.update(extra)
        return h

    def inst(self):
        return self.w.any_instance(self.rng)

    def alive(self):
        return not self.w.stop.is_set() and time.monotonic() < self.w.deadline - 1

    def f(self):
        return {"buyer": self.user, "q": self.q, "entry": self.entry}

    def join(self):
        for _ in range(40):
            if not self.alive():
                return None
            code, body = self.c.call("join", self.inst(), "POST", f"/api/queues/{self.q}/entries",
                                     headers=self.hdr(), buyer=self.user, q=self.q)
            if code in (200, 201):
                self.ticket = body["ticket"]
                self.entry = ticket_entry(self.ticket)
                with self.w.lock:
                    self.w.places[(self.q, self.user, self.entry)] = self.ticket
                # The entry, known only from the answer, joins the record.
                self.c.h.record({"op": "joined", **self.f(), "status": body.get("status"),
                                 "code": code})
                return body
            time.sleep(self.rng.uniform(0.2, 0.8))
        return None

    def poll(self, op="poll"):
        code, body = self.c.call(op, self.inst(), "GET", f"/api/queues/{self.q}/position",
                                 headers=self.hdr(), **self.f())
        return code, body

    def leave(self):
        code, _ = self.c.call("leave", self.inst(), "DELETE", f"/api/queues/{self.q}/entries/me",
                              headers=self.hdr(), **self.f())
        return code

    def live(self):
        style = self.rng.choices(["stream", "poll", "ghost"], [0.6, 0.33, 0.07])[0]
        body = self.join()
        if body is None:
            return
        if style == "ghost":
            # Silent after the join: abandoned after --abandon-after-secs
            # (unless admitted first and its token lapses); one look at the end.
            self.w.stop.wait(self.w.s["abandon_after"] + self.rng.uniform(3, 8))
            if self.alive():
                self.poll()
            return
        state = body
        rejoined = False
        if style == "stream":
            self.stream = Stream(self)
            self.stream.start()
        waited = time.monotonic()
        while self.alive():
            status = state.get("status") if isinstance(state, dict) else None
            if status == "READY" and state.get("entryToken"):
                self.token = state["entryToken"]
                break
            if self.stream is not None and self.stream.ready_token:
                self.token = self.stream.ready_token
                break
            if self.stream is not None and self.stream.gone:
                break
            if status is None and state is not None and state.get("error") == "ticket_ended":
                break
            if not rejoined and self.rng.random() < 0.01 and time.monotonic() - waited > 1:
                # Leave, then come back: a new place at the end of the line.
                if self.stream:
                    self.stream.close()
                    self.stream = None
                self.leave()
                rejoined = True
                time.sleep(self.rng.uniform(0.2, 1.5))
                state = self.join()
                if state is None:
                    return
                if style == "stream":
                    self.stream = Stream(self)
                    self.stream.start()
                continue
            time.sleep(self.rng.uniform(0.4, 1.0) if style == "poll" else self.rng.uniform(1.5, 3))
            code, got = self.poll()
            if code == 200:
                state = got
            elif code == 401:
                state = got or {}
        if self.stream:
            if self.token:
                time.sleep(0.2)
            self.stream.close()
            self.stream = None
        if self.token and self.alive():
            self.use_token()

    def use_token(self):
        action = self.rng.choices(["order", "api", "api_release", "lapse", "bogus"],
                                  [0.35, 0.3, 0.1, 0.15, 0.1])[0]
        if self.q != "default" and action in ("order", "bogus"):
            action = "api"  # the demo product is sold through "default" only
        if action == "order":
            self.order(self.token)
            self.order(self.token)  # a second purchase with one token is refused
        elif action in ("api", "api_release"):
            claim = self.claim(self.token)
            if claim and action == "api_release":
                self.c.call("release", self.inst(), "POST", "/api/tokens/release",
                            headers=self.w.svc_headers(), admin=True,
                            body={"userId": self.user, "queue": self.q, "claimId": claim},
                            token=self.token, claim=claim, **self.f())
                claim = self.claim(self.token)
            if claim:
                for _ in range(10):
                    code, _ = self.c.call("consume", self.inst(), "POST", "/api/tokens/consume",
                                          headers=self.w.svc_headers(), admin=True,
                                          body={"userId": self.user, "queue": self.q,
                                                "claimId": claim},
                                          token=self.token, claim=claim, **self.f())
                    if code == 204 or not self.alive():
                        break
                    time.sleep(0.3)
            self.claim(self.token)  # a used token is refused
        elif action == "lapse":
            self.w.stop.wait(self.w.s["token_ttl"] + 2)
            if self.alive():
                self.poll()
                self.order(self.token)
        else:
            self.order(secrets.token_urlsafe(24), bogus=True)
            self.order(self.token)

    def order(self, token, bogus=False):
        qty = self.rng.choice([1, 1, 2])
        for _ in range(3):
            code, body = self.c.call("order", self.inst(), "POST", "/api/orders",
                                     headers={"X-User-Id": self.user, "X-Entry-Token": token},
                                     body={"productId": PRODUCT, "quantity": qty},
                                     token=token, bogus=bogus, qty=qty, **self.f())
            if code not in (None, 503) or not self.alive():
                return code
            time.sleep(0.3)
        return code

    def claim(self, token, bogus=False):
        for _ in range(5):
            code, body = self.c.call("claim", self.inst(), "POST", "/api/tokens/claim",
                                     headers=self.w.svc_headers(), admin=True,
                                     body={"token": token}, token=token, bogus=bogus, **self.f())
            if code == 200:
                return body.get("claimId")
            if code not in (None, 503) or not self.alive():
                return None
            time.sleep(0.3)
        return None


class Stream:
    """An SSE connection that comes back (to any instance, with
    Last-Event-ID) whenever it drops, until the place ends or the buyer
    closes it."""

    def __init__(self, buyer):
        self.b = buyer
        self.key = (buyer.q, buyer.user, buyer.entry)
        self.closed = threading.Event()
        self.gone = False
        self.ready_token = None
        self.last_id = None
        self.conn = None

    def start(self):
        with self.b.w.lock:
            self.b.w.streams[self.key] = self
        threading.Thread(target=self.run, daemon=True).start()

    def close(self):
        if self.closed.is_set():
            return
        self.closed.set()
        with self.b.w.lock:
            self.b.w.streams.pop(self.key, None)
        self.b.c.h.record({"op": "sse_close", **self.b.f()})
        c = self.conn
        if c is not None:
            try:
                c.sock and c.sock.shutdown(2)
            except OSError:
                pass

    def run(self):
        h = self.b.c.h
        while not self.closed.is_set() and not self.gone:
            inst = self.b.inst()
            headers = self.b.hdr(Accept="text/event-stream")
            if self.last_id:
                headers["Last-Event-ID"] = self.last_id
            t0, w0 = h.now()
            try:
                # Keep-alive comments come every --keep-alive-secs (15 s):
                # 25 s of silence is a dead or stopped instance.
                self.conn = http.client.HTTPConnection("127.0.0.1", inst.port, timeout=25)
                self.conn.request("GET", f"/api/queues/{self.b.q}/events", headers=headers)
                resp = self.conn.getresponse()
                h.record({"op": "sse_open", "inst": inst.idx, "code": resp.status,
                          "t0": round(t0, 4), "w0": w0, **self.b.f()})
                if resp.status == 200:
                    self.read(resp, inst)
                else:
                    resp.read()
                    if resp.status == 401:
                        self.gone = True
                        break
            except Exception as e:
                if not self.closed.is_set():
                    h.record({"op": "sse_drop", "inst": inst.idx, "err": type(e).__name__,
                              **self.b.f()})
            finally:
                try:
                    self.conn.close()
                except Exception:
                    pass
            if not self.closed.is_set() and not self.gone:
                time.sleep(self.b.rng.uniform(0.2, 1.0))
        with self.b.w.lock:
            self.b.w.streams.pop(self.key, None)

    def read(self, resp, inst):
        event, data, eid = None, [], None
        while not self.closed.is_set():
            line = resp.fp.readline()
            if not line:
                return
            line = line.decode().rstrip("\r\n")
            if line == "":
                if data:
                    self.dispatch(inst, event or "message", eid, "\n".join(data))
                    if self.gone:
                        return
                event, data, eid = None, [], None
            elif line.startswith(":"):
                # A keep-alive: the stream is open, so the buyer is present.
                self.b.c.h.record({"op": "alive", "inst": inst.idx, **self.b.f()})
            else:
                name, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if name == "event":
                    event = value
                elif name == "data":
                    data.append(value)
                elif name == "id":
                    eid = value

    def dispatch(self, inst, event, eid, raw):
        try:
            data = json.loads(raw)
        except ValueError:
            data = raw
        if eid:
            self.last_id = eid
        self.b.c.h.record({"op": "event", "event": event, "id": eid, "inst": inst.idx,
                           "body": slim(data), **self.b.f()})
        if event == "ready" and isinstance(data, dict) and data.get("entryToken"):
            self.ready_token = data["entryToken"]
        if event == "gone":
            self.gone = True
