#!/usr/bin/env python3
"""The history checker: proves, from the history file alone, per queue,
FIFO, the admission rate, exactly once, durability and convergence
(docs/faults.md says what each means and why each bound is what it is).

  checker.py history.jsonl

A violation names the invariant, the places involved, the seed, the
history slice around it and the command that replays the campaign.
"""

import base64
import bisect
import json
import math
import sys
from collections import defaultdict

STORE_READS = ("join", "poll", "probe", "final")
SLACK_S = 1.5  # client-side timing slack: rounding of seconds fields, request flight


def ticket_entry(ticket):
    try:
        payload = ticket.split(".")[0]
        raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).decode()
        return int(raw.split("\n")[2])
    except Exception:
        return None


class Place:
    """One place in one queue: a user's entry, from its acknowledged join
    until it ended."""

    def __init__(self, key, epoch):
        self.key, self.epoch = key, epoch
        self.join = None          # the acknowledging join record
        self.lottery = False      # joined into a lottery's pre-queue
        self.lottery_unknown = False  # may have: a pre-queue join whose answer was lost
        self.obs = []             # (t_send, t_recv, source, state, rec)
        self.events = []          # stream events (t, name, body)
        self.tokens = {}          # token -> first seen t
        self.expires_by = {}      # token -> latest time it can still be valid
        self.expires_from = {}    # token -> earliest time it can have lapsed
        self.admitted_at = None   # store ms of the admitting pass (ready event)
        self.fast_track = False
        # When the place may have been made: the send time of the first
        # join attempt that could have made it. A join answered 503, or
        # never answered, may still have run; the acknowledging join may
        # then be a repeat one (200) of a place made seconds earlier.
        self.first_attempt_w0 = None
        self.attempts_t0 = []     # send times (t) of those attempts and of the acknowledging join
        self.leave_sent = None
        self.spent_sent = None    # first order/claim request with its token
        self.presence = []        # times the buyer was certainly present
        self.stream_open = []     # (open t, close t)
        self.closed_at = None

    def first_ready(self):
        ts = [o[1] for o in self.obs if o[3][0] == "READY"]
        return min(ts) if ts else None


def state_of(code, body):
    if code == 200 and isinstance(body, dict):
        st = body.get("status")
        if st == "WAITING":
            return ("WAITING", body.get("rank"))
        if st == "READY":
            return ("READY", body.get("entryToken"))
        if st:
            return (st, None)
    if code in (200, 201) and isinstance(body, dict) and body.get("status"):
        return state_of(200, body)
    if code == 401 and isinstance(body, dict) and body.get("error") == "ticket_ended":
        return ("ENDED", None)
    return None


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def check(path):
    recs = load(path)
    meta = next((r for r in recs if r["op"] == "meta"), {})
    res = Result(meta, recs)
    places, epochs = build_places(recs, res)
    check_durability(places, meta, res)
    mark_unanswered_lottery_joins(places, recs, res)
    check_fifo(places, res, recs, meta.get("wait_replicas", 0))
    check_rate(places, recs, meta, res, epochs)
    check_exactly_once(places, recs, res)
    check_convergence(places, recs, meta, res)
    res.ops = sum(1 for r in recs if r["op"] not in ("alive", "meta"))
    res.faults = defaultdict(int)
    for r in recs:
        if r["op"] == "fault" and r.get("phase") == "start":
            res.faults[r["fault"]] += 1
        elif r["op"] == "supervisor_restart":
            # An instance that exited by itself, started again (nemesis.py).
            res.stats["supervisor_restarts"] += 1
        elif r["op"] == "heal_timeout":
            res.stats["heal_timeouts"] += 1
    return res.summary()


class Result:
    def __init__(self, meta, recs):
        self.meta, self.recs = meta, recs
        self.violations = []
        self.exceptions = defaultdict(int)
        self.losses = defaultdict(int)
        self.convergence = []
        self.unconverged = 0
        self.stats = defaultdict(int)

    def violate(self, invariant, what, places=(), t_from=None, t_to=None):
        self.violations.append({"invariant": invariant, "what": what,
                                "places": [list(p) for p in places],
                                "t": [t_from, t_to]})

    def slice(self, v, limit=40):
        keys = {tuple(p) for p in v["places"]}
        users = {k[1] for k in keys}
        lo = (v["t"][0] or 0) - 2
        hi = (v["t"][1] or v["t"][0] or 0) + 2
        out = [r for r in self.recs
               if (r.get("buyer") in users or r["op"] in ("fault", "healed"))
               and lo <= r.get("t", 0) <= hi and r["op"] != "alive"]
        if len(out) > limit:
            mine = [r for r in out if r.get("buyer") in users]
            out = mine[:limit]
        return out

    def summary(self):
        conv = sorted(self.convergence)

        def pct(p):
            if not conv:
                return None
            return round(conv[min(len(conv) - 1, int(math.ceil(p * len(conv))) - 1)], 3)

        for v in self.violations:
            v["slice"] = self.slice(v)
        return {
            "kind": self.meta.get("kind"), "seed": self.meta.get("seed"),
            "replay": self.meta.get("replay"), "plant": self.meta.get("plant"),
            "seconds": self.meta.get("seconds"), "wait_replicas": self.meta.get("wait_replicas"),
            "ops": self.ops, "faults": dict(self.faults), "stats": dict(self.stats),
            "violations": self.violations, "exceptions": dict(self.exceptions),
            "losses": dict(self.losses),
            "convergence": {"n": len(conv), "p50": pct(0.5), "p99": pct(0.99),
                            "max": conv[-1] if conv else None,
                            "bound_s": self.meta.get("bound_s"),
                            "unmeasured": self.unconverged},
            # Seconds from the workload's start (the meta line, written once
            # every process was up) to the first violation's evidence.
            "first_violation_t": round(min((v["t"][1] or v["t"][0] or 0) for v in self.violations)
                                       - self.meta.get("t", 0), 1)
            if self.violations else None,
        }


def build_places(recs, res):
    """Places by (queue, user, entry) and the store epochs: the memory
    store starts empty when its one instance is killed."""
    places = {}
    epoch = 0
    epochs = [0.0]
    by_user = {}  # (q, user) -> current place key
    # (q, user) -> send times (w0; and (w0, t0)) of join attempts without an
    # answer since their last acknowledged join: any of them may have run.
    unanswered, unanswered_t = {}, {}
    for r in recs:
        op = r["op"]
        if r.get("store_wiped") and (op == "supervisor_restart" or r.get("phase") == "start"):
            epoch += 1
            epochs.append(r["t"])
            continue
        user, q = r.get("buyer"), r.get("q")
        if user is None or q is None:
            continue
        body = r.get("body") if isinstance(r.get("body"), dict) else {}
        if op == "join":
            if r.get("code") in (200, 201) and body.get("ticket"):
                key = (q, user, ticket_entry(body["ticket"]))
                p = places.get(key)
                if p is None:
                    p = places[key] = Place(key, epoch)
                    p.join = r
                    p.lottery = body.get("status") == "PRE_QUEUE"
                    # Admitted at once by this very join (201: it made the
                    # place). A 200 READY is a place made earlier, by an
                    # attempt whose answer was lost, and admitted since.
                    p.fast_track = body.get("status") == "READY" and r.get("code") == 201
                    earlier = unanswered.get((q, user), [])
                    p.first_attempt_w0 = min(earlier + [r["w0"]])
                    p.attempts_t0 = [t for _, t in unanswered_t.get((q, user), [])] + [r["t0"]]
                    res.stats["joins_acked"] += 1
                unanswered.pop((q, user), None)
                unanswered_t.pop((q, user), None)
                by_user[(q, user)] = key
                add_obs(p, r, "join")
            elif r.get("code") not in (400, 401, 403, 404, 409, 422, 429):
                # 503, a timeout, a reset: it may have run.
                unanswered.setdefault((q, user), []).append(r["w0"])
                unanswered_t.setdefault((q, user), []).append((r["w0"], r["t0"]))
            continue
        key = (q, user, r.get("entry"))
        p = places.get(key)
        if p is None:
            continue
        if op in ("poll", "probe", "final"):
            add_obs(p, r, op)
        elif op == "event":
            p.events.append((r["t"], r["event"], body))
            p.presence.append(r["t"])
            st = state_of(200, body) if r["event"] != "gone" else ("ENDED", body.get("reason"))
            if st:
                p.obs.append((r["t"], r["t"], "event", st, r))
                if st[0] == "READY" and st[1]:
                    note_token(p, st[1], r["t"], body, r)
            if r["event"] == "ready" and body.get("admittedAt"):
                p.admitted_at = body["admittedAt"] if p.admitted_at is None else p.admitted_at
        elif op == "alive":
            p.presence.append(r["t"])
        elif op == "sse_open":
            if r.get("code") == 200:
                p.presence.append(r["t"])
                p.stream_open.append([r["t"], None])
            elif r.get("code") == 401:
                p.obs.append((r["t0"], r["t"], "sse_open", ("ENDED", None), r))
        elif op in ("sse_close",):
            p.closed_at = r["t"]
        elif op == "leave":
            if r.get("code") != 401 and p.leave_sent is None:
                p.leave_sent = r["t0"]
        elif op in ("order", "claim") and not r.get("bogus"):
            if p.spent_sent is None:
                p.spent_sent = r["t0"]
    return places, epochs


def add_obs(p, r, source):
    st = state_of(r.get("code"), r.get("body"))
    if st is None:
        return
    p.obs.append((r["t0"], r["t"], source, st, r))
    if r.get("code") in (200, 201):
        p.presence.append(r["t0"])
    if st[0] == "READY" and st[1]:
        note_token(p, st[1], r["t"], r["body"])


def note_token(p, token, t, body, rec=None):
    """`tokenExpiresInSeconds` is whole seconds, rounded up: the token
    lapses between t + ttl - 1 and t + ttl. `expires_by` (the latest it can
    still be valid, + 1 s of flight) judges a late order; `expires_from`
    (the earliest it can have lapsed) judges whether an end was a lapse.
    A stream's `ready` event may arrive long after its pass (an instance
    paused or cut from pub/sub delivers it late, with the pass's full
    TTL): when it names the pass's store time (`admittedAt`), the token
    lapses from that time on, whenever the event came."""
    p.tokens.setdefault(token, t)
    ttl = body.get("tokenExpiresInSeconds")
    if ttl is not None:
        by = t + ttl + 1.0
        p.expires_by[token] = max(p.expires_by.get(token, 0), by)
        start = t
        if body.get("admittedAt") and rec is not None and "w" in rec:
            # The pass's store time on the client's clock (one machine).
            start = min(t, rec["t"] - (rec["w"] - body["admittedAt"]) / 1000)
        p.expires_from[token] = min(p.expires_from.get(token, float("inf")), start + ttl - 1.0)


def ordered_before(a, b):
    """Must `a` be admitted no later than `b`? None when the README lets
    either go first (the lottery's drawn order)."""
    if b.lottery:
        return None if a.lottery else False
    if a.lottery:
        return True
    return a.key[2] < b.key[2]


# How long after a restock went unanswered it may still run: an instance
# paused with it in hand (the nemesis pauses for at most 10 s) runs it on
# resuming.
RESTOCK_HELD_S = 15.0

MASTER_LOSS = ("master_kill", "master_kill_lagging", "redis_pause")


# How long after a master fault ends the old master may still take writes:
# a paused one resumes and runs what its clients sent meanwhile, a
# restarted one serves as master, until it learns it was replaced (a
# Cluster node within its node timeout, 2 s).
FORK_SLACK_S = 2.0


def failovers(recs):
    """(t from, t to, wall ms from, wall ms to) of every fault that can
    cost a master its last writes, from its start to FORK_SLACK_S after its
    end: without WAIT, a failover may roll the queue's state back a few
    writes, entry ids included, and an old master paused or restarted may
    take writes of its own until it is demoted (docs/faults.md)."""
    starts, out = {}, []
    for r in recs:
        if r["op"] != "fault" or r.get("fault") not in MASTER_LOSS:
            continue
        if r.get("phase") == "start":
            starts[r["id"]] = r
        elif r.get("phase") == "end" and r.get("id") in starts:
            s = starts.pop(r["id"])
            out.append((s["t"], r["t"] + FORK_SLACK_S, s["w"], r["w"] + FORK_SLACK_S * 1000))
    for s in starts.values():  # still on when the run ended
        out.append((s["t"], math.inf, s["w"], math.inf))
    return out


def overlaps(a_from, a_to, b_from, b_to):
    return a_from <= b_to and b_from <= a_to


def mark_unanswered_lottery_joins(places, recs, res):
    """A join to a queue whose lottery is scheduled and not yet drawn puts
    the buyer in the pre-queue, and the draw then places them in a random
    order (the README's lottery order). A buyer whose pre-queue join went
    unanswered (503 or a timeout that still ran) and who is first seen in
    line later, through a repeat join (200), was never seen as PRE_QUEUE:
    counted here as a lottery entrant when any of their join attempts was
    sent between the schedule and the first time any pre-queue entrant of
    the queue was read in line (the draw done by then). Such a place may
    be either (its attempt may have run after the draw), so FIFO compares
    it with nobody."""
    scheduled = {}
    for r in recs:
        if r["op"] == "schedule_lottery" and r.get("code") == 200:
            scheduled[r["q"]] = min(scheduled.get(r["q"], r["t0"]), r["t0"])
    drawn = {}
    for p in places.values():
        if p.lottery:
            seen = [o[1] for o in p.obs if o[3][0] in ("WAITING", "READY")]
            if seen:
                drawn[p.key[0]] = min(drawn.get(p.key[0], seen[0]), min(seen))
    for p in places.values():
        q = p.key[0]
        if p.lottery or q not in scheduled or p.join.get("code") != 200:
            continue
        until = drawn.get(q, float("inf"))
        if any(scheduled[q] <= t < until for t in p.attempts_t0):
            p.lottery_unknown = True
            res.exceptions["lottery entrant or not (a join during the draw, its answer lost)"] += 1


def check_fifo(places, res, recs=(), wait=1):
    """No buyer admitted while one ahead of it still waited. Two proofs,
    each a sweep in time order: (1) a place seen READY, then a store read
    sent later that says an earlier place is still WAITING; (2) the
    admitting passes' store times, where streams saw both."""
    by_queue = defaultdict(list)
    for p in places.values():
        if not p.lottery_unknown:
            by_queue[(p.key[0], p.epoch)].append(p)
    # With WAIT, a READY only *read* (a poll, a repeat join, a stream's
    # re-read) may be an admission the store ran but never acknowledged,
    # read on an old master a failover then replaced: it proves an
    # admission only once its token is confirmed — shown by a published
    # pass or a 201 READY, or spent (a claim, an order, a consume answered:
    # with WAIT those are answered only once replicas hold them).
    confirmed = set()
    if wait > 0:
        for r in recs:
            if r.get("token") and (r["op"], r.get("code")) in (
                    ("claim", 200), ("order", 201), ("consume", 204)):
                confirmed.add(r["token"])
        for p in places.values():
            confirmed.update(o[3][1] for o in p.obs if acknowledged_ready(o))
    for (q, _), ps in by_queue.items():
        marks = []  # (t, order, kind, place): READY seen (0) sorts before a read sent then (1)
        for p in ps:
            t = p.first_ready()
            if wait > 0:
                seen = [o[1] for o in p.obs if o[3][0] == "READY" and o[3][1] in confirmed]
                if t is not None and not seen:
                    res.exceptions["READY read, never confirmed (with WAIT)"] += 1
                t = min(seen) if seen else None
            if t is not None and not p.lost_admission:
                marks.append((t, 0, p))
            for t0, t1, src, st, _ in p.obs:
                if src in STORE_READS and st[0] == "WAITING":
                    marks.append((t0, 1, p))
        if wait == 0:
            # Without WAIT a failover may lose the last writes and hand out
            # entry ids again, and two nodes may both take writes until the
            # old one is demoted: "ahead" is only defined within one
            # stretch between master faults, and nothing is compared while
            # one lasts.
            spans = failovers(recs)
            marks = [m for m in marks if not any(f <= m[0] <= to for f, to, _, _ in spans)]
            marks += [(t, -1, None) for f, to, _, _ in spans for t in (f, to)]
        marks.sort(key=lambda m: (m[0], m[1]))
        latest = None  # the non-lottery place with the highest entry seen READY so far
        any_ready = None
        for t, kind, p in marks:
            if kind == -1:
                if latest is not None:
                    res.exceptions["reset by a failover without WAIT"] += 1
                latest = any_ready = None
                continue
            if kind == 0:
                if p.lottery:
                    continue
                any_ready = any_ready or (t, p)
                if latest is None or p.key[2] > latest[1].key[2]:
                    latest = (t, p)
                continue
            if latest is None:
                continue
            if p.lottery:
                b = any_ready
            elif latest[1].key[2] > p.key[2] and latest[1] is not p:
                b = latest
            else:
                continue
            res.violate("fifo", f"{b[1].key} admitted (seen READY at {b[0]:.3f}) while "
                        f"{p.key}, ahead of it, still waited (a read sent at {t:.3f} "
                        "answered WAITING)", [p.key, b[1].key], b[0], t)
            break
        with_pass = sorted([p for p in ps if p.admitted_at and not p.lost_admission],
                           key=lambda p: p.admitted_at)
        best = None  # earlier pass, non-lottery, highest entry
        losses_w = [(wf, wt) for _, _, wf, wt in failovers(recs)] if wait == 0 else []
        i = 0
        while i < len(with_pass):
            if best is not None and any(overlaps(wf, wt, best.admitted_at,
                                                 with_pass[i].admitted_at)
                                        for wf, wt in losses_w):
                best = None  # a failover without WAIT between (or around) the two passes
            j = i
            while j < len(with_pass) and with_pass[j].admitted_at == with_pass[i].admitted_at:
                j += 1
            group = with_pass[i:j]
            for a in group:
                if best is not None and (a.lottery or best.key[2] > a.key[2]):
                    res.violate("fifo", f"{best.key} admitted by the pass at {best.admitted_at} "
                                f"before {a.key}, ahead of it, admitted by the pass at "
                                f"{a.admitted_at}", [a.key, best.key], best.first_ready(),
                                a.first_ready())
                    break
            for a in group:
                if not a.lottery and (best is None or a.key[2] > best.key[2]):
                    best = a
            i = j
        for p in ps:
            if any(e[1] == "gone" and e[2].get("reason") == "abandoned" for e in p.events):
                res.exceptions["abandonment"] += 1
            if p.fast_track:
                res.exceptions["fast track"] += 1
            if p.lottery:
                res.exceptions["lottery order"] += 1


def admission_interval(p):
    """When the place was admitted, in wall ms: the pass's store time when
    a stream saw it, else between the last read that saw it waiting and the
    first that saw it READY."""
    if p.admitted_at:
        return p.admitted_at, p.admitted_at
    if p.fast_track:
        return p.join["w0"], p.join["w"]
    ready = [(o[4]["w"], o) for o in p.obs if o[3][0] == "READY"]
    if not ready:
        return None
    hi = min(r[0] for r in ready)
    # Only a store read proves the place still waited when it was sent: a
    # stream's `waiting` event may come late from an instance that missed
    # the admitting pass (paused, or cut from pub/sub) and shows what it
    # last knew, not the store.
    lo = max([o[4].get("w0", o[4]["w"]) for o in p.obs
              if o[2] in STORE_READS and o[3][0] in ("WAITING", "PRE_QUEUE")
              and o[4].get("w0", o[4]["w"]) <= hi]
             + [p.first_attempt_w0])
    return lo, hi


def check_rate(places, recs, meta, res, epochs):
    batch, interval = meta.get("batch"), meta.get("interval_ms")
    if not batch:
        return
    # Without WAIT a failover may lose the bucket's last writes: one batch
    # more per master fault is then what the design allows.
    spans = [(wf, wt) for _, _, wf, wt in failovers(recs)]
    wait = meta.get("wait_replicas", 0)
    by_queue = defaultdict(list)
    for p in places.values():
        iv = admission_interval(p)
        if iv:
            by_queue[(p.key[0], p.epoch)].append((iv[0], iv[1], p))
    for (q, _), adm in by_queue.items():
        adm.sort(key=lambda x: x[0])
        res.stats["admissions"] += len(adm)
        los = [x[0] for x in adm]
        for k in (1, 5, 25):
            window = k * interval
            for i, (lo, _, _) in enumerate(adm):
                j = bisect.bisect_right(los, lo + window)
                inside = [x for x in adm[i:j] if x[1] <= lo + window]
                extra = 0
                if wait == 0:
                    extra = batch * sum(1 for wf, wt in spans
                                        if overlaps(wf, wt, lo - 10000, lo + window))
                bound = batch + window * batch / interval + extra
                if len(inside) > bound + 1e-9:
                    res.violate("rate", f"{len(inside)} admitted in {window} ms of queue {q} "
                                f"(bound {bound:g}: {batch} per {interval} ms plus one batch)",
                                [x[2].key for x in inside[:6]],
                                min(x[2].first_ready() or 0 for x in inside),
                                max(x[2].first_ready() or 0 for x in inside))
                    break


def check_exactly_once(places, recs, res):
    spans = failovers(recs)
    owner = {}
    for p in places.values():
        for tok in p.tokens:
            if tok in owner and owner[tok] is not p:
                res.violate("exactly-once", f"one token shown to two places {owner[tok].key} "
                            f"and {p.key}", [owner[tok].key, p.key], p.tokens[tok], None)
            owner[tok] = p
        straddles = len(p.tokens) > 1 and meta_wait(recs) == 0 and any(
            overlaps(f, to, min(p.tokens.values()) - 1.0, max(p.tokens.values()))
            for f, to, _, _ in spans)
        if len(p.tokens) > 1 and straddles:
            res.exceptions["re-admitted after a failover without WAIT"] += 1
        elif len(p.tokens) > 1 and not p.lost_admission:
            res.violate("exactly-once", f"{p.key} was shown {len(p.tokens)} different tokens",
                        [p.key], min(p.tokens.values()), max(p.tokens.values()))
    # Without WAIT a failover may lose a consume like any last write: the
    # token is then live again on the promoted replica (docs/production.md).
    # With WAIT a consume is answered only once replicas hold it.
    no_wait = meta_wait(recs) == 0

    def lost_by_failover(t_from, t_to):
        return no_wait and any(overlaps(f, to, t_from - 1.0, t_to) for f, to, _, _ in spans)

    bought = defaultdict(list)  # token -> [(t, how)]
    restock_pending_until = 0.0
    consumed_at = {}
    sold = defaultdict(int)
    stock_epoch = None
    for r in recs:
        op, code = r["op"], r.get("code")
        tok = r.get("token")
        if op == "restock" and meta_shared(recs):
            if code == 200 and r["t"] >= restock_pending_until:
                stock_epoch = {"stock": r.get("stock"), "after": r["t"], "sold": 0}
                sold = stock_epoch
            else:
                # An unknown outcome, or an answered restock while an
                # unanswered one may still land: a paused instance holds the
                # request and runs it when it resumes (an `inst_pause` lasts
                # at most 10 s), resetting the stock after later sales.
                # The sum below is not checked until a restock after that.
                stock_epoch = None
                if code != 200:
                    restock_pending_until = max(restock_pending_until, r["t"] + RESTOCK_HELD_S)
        if op == "products" and isinstance(r.get("body"), list):
            pass
        if op not in ("order", "claim", "consume"):
            continue
        p = owner.get(tok)
        ok = (op == "order" and code == 201) or (op == "claim" and code == 200)
        if ok:
            res.stats["orders" if op == "order" else "claims"] += 1
            if r.get("bogus") or p is None:
                res.violate("exactly-once", f"{op} with a token never issued succeeded",
                            [(r.get("q"), r.get("buyer"), r.get("entry"))], r["t0"], r["t"])
                continue
            if p.key[1] != r.get("buyer"):
                res.violate("exactly-once", f"{op} with {p.key}'s token by {r.get('buyer')}",
                            [p.key], r["t0"], r["t"])
            exp = p.expires_by.get(tok)
            if exp is not None and r["t0"] > exp + SLACK_S:
                res.violate("exactly-once", f"{op} with an expired token of {p.key} succeeded "
                            f"(sent {r['t0'] - exp:.1f} s after it lapsed)", [p.key], exp, r["t"])
            if op == "claim" and p is not None:
                # A claim's lease keeps the token alive at least until the
                # lease ends (claim.lua); a release leaves it READY till then.
                lease = (recs[0].get("claim_lease_s") or 5) if recs else 5
                p.expires_by[tok] = max(p.expires_by.get(tok, 0), r["t"] + lease + 1.0)
            if tok in consumed_at and lost_by_failover(consumed_at[tok], r["t"]):
                res.exceptions["a consume lost in a failover without WAIT"] += 1
            elif tok in consumed_at:
                res.violate("exactly-once", f"{op} succeeded with {p.key}'s token after it was "
                            f"consumed at {consumed_at[tok]:.3f}", [p.key], consumed_at[tok], r["t"])
        if op == "order" and code == 201:
            bought[tok].append((r["t"], "order"))
            consumed_at.setdefault(tok, r["t"])
            if stock_epoch is not None and r["t0"] > stock_epoch["after"]:
                stock_epoch["sold"] += r.get("qty", 1)
                if stock_epoch["sold"] > stock_epoch["stock"]:
                    res.violate("exactly-once", f"{stock_epoch['sold']} units sold from a stock "
                                f"of {stock_epoch['stock']}: stock below zero", [p.key] if p else [],
                                stock_epoch["after"], r["t"])
                    stock_epoch = None
        if op == "consume" and code == 204 and p is not None:
            claim = r.get("claim")
            if (r["t"], claim) and claim not in [c for _, c in bought[tok]]:
                bought[tok].append((r["t"], claim))
            consumed_at.setdefault(tok, r["t"])
    for r in recs:
        if r["op"] == "products" and isinstance(r.get("body"), list):
            for prod in r["body"]:
                if isinstance(prod, dict) and prod.get("stock", 0) < 0:
                    res.violate("exactly-once", f"stock read below zero: {prod}", [], r["t"], None)
    for tok, buys in bought.items():
        if len(buys) > 1 and lost_by_failover(buys[0][0], buys[1][0]):
            res.exceptions["a consume lost in a failover without WAIT"] += 1
        elif len(buys) > 1:
            p = owner.get(tok)
            res.violate("exactly-once", f"one token bought {len(buys)} times: {buys}",
                        [p.key] if p else [], buys[0][0], buys[1][0])


def meta_wait(recs):
    return recs[0].get("wait_replicas", 0) if recs else 0


def meta_shared(recs):
    """One stock for every instance (PostgreSQL shared, or one instance)."""
    return recs[0].get("shared_stock", True) if recs else True


def last_gap_before(p, t):
    """Longest stretch without proof of presence before `t`."""
    pts = sorted([x for x in p.presence if x <= t] + [p.join["t0"]])
    gaps = [b - a for a, b in zip(pts, pts[1:])] + [t - pts[-1]]
    return max(gaps) if gaps else 0


def check_durability(places, meta, res):
    wait = meta.get("wait_replicas", 0)
    memory = meta.get("kind") == "memory"
    abandon = meta.get("abandon_after", 0)
    wiped_epochs = set()
    for p in places.values():
        p.lost_admission = False
    max_epoch = max((p.epoch for p in places.values()), default=0)
    for p in places.values():
        obs = sorted(p.obs, key=lambda o: o[1])
        ended = next((o for o in obs if o[3][0] == "ENDED"), None)
        ready = next((o for o in obs if o[3][0] == "READY"), None)
        # An admission rolled back: READY, then a store read saying WAITING.
        if ready:
            back = next((o for o in obs if o[2] in STORE_READS and o[0] > ready[1]
                         and o[3][0] == "WAITING"), None)
            if back:
                p.lost_admission = True
                acked = next((o for o in obs if o[1] < back[0] and acknowledged_ready(o)), None)
                if acked:
                    record_loss(res, p, "admission", wait, memory, back[1], acked[1],
                                "READY, then a read said WAITING")
                else:
                    # Seen only by reads: an admission the store ran but
                    # never acknowledged (its WAIT failed), read on the
                    # master before a failover dropped it. WAIT covers what
                    # was answered or published (docs/production.md); a
                    # read of the unacknowledged is counted, not a breach.
                    res.losses["unacknowledged admission read, then lost"] += 1
                continue
        if not ended:
            continue
        t_end = ended[1]
        reason = ended[3][1]
        if reason in ("left", "consumed", "expired", "abandoned", "sold_out", "replaced"):
            continue
        if p.leave_sent is not None and p.leave_sent <= t_end:
            continue
        if ready:
            lapse = min(p.expires_from.values(), default=ready[1] + meta.get("token_ttl", 0) - 1)
            # The read may have reached the store as late as its answer
            # came back (an instance paused with the request in hand
            # serves it on resume): an end is a lapse if it could have
            # been read after the token lapsed.
            if ended[1] >= lapse - 0.2 or (p.spent_sent is not None and p.spent_sent <= t_end):
                continue
        gap = last_gap_before(p, t_end)
        if abandon and gap >= abandon - 3:
            continue  # absent long enough to be dropped (fault or ghost)
        if not ready and gap >= meta.get("token_ttl", 0) - 0.5:
            # Unseen long enough to be admitted right after the last look
            # and let the token lapse (0.5 s: the client's timing error).
            continue
        if memory and p.epoch < max_epoch:
            # The memory store lost it with its one instance: by design.
            wiped_epochs.add(p.epoch)
            res.losses["memory store restart (by design)"] += 1
            continue
        what = "admission" if ready else "join"
        if ready:
            p.lost_admission = True
        record_loss(res, p, what, wait, memory, t_end, (ready or obs[0])[1],
                    f"acknowledged, then ended ({ended[2]}) with no leave, order, expiry or absence")


def acknowledged_ready(o):
    """Whether observation `o` is the store acknowledging an admission:
    a stream's event from a published pass (`admittedAt`: with WAIT, a
    pass is published only once replicas hold it) or a join that made its
    place admitted at once (201 READY, answered after its WAIT). A READY
    read by a poll, a repeat join or a stream's re-read is not one."""
    _, _, src, st, r = o
    if st[0] != "READY":
        return False
    body = r.get("body") if isinstance(r.get("body"), dict) else {}
    if src == "event":
        return body.get("admittedAt") is not None
    return src == "join" and r.get("code") == 201


def record_loss(res, p, what, wait, memory, t_seen, t_acked, how):
    res.losses[f"lost {what}"] += 1
    if wait >= 1 and not memory:
        res.violate("durability", f"{p.key}: {what} lost with --redis-wait-replicas {wait}: {how}",
                    [p.key], t_acked, t_seen)


def check_convergence(places, recs, meta, res):
    bound = meta.get("bound_s", 15.0)
    for r in recs:
        if r["op"] != "probe":
            continue
        key = (r.get("q"), r.get("buyer"), r.get("entry"))
        p = places.get(key)
        if p is None:
            continue
        st = state_of(r.get("code"), r.get("body"))
        if st is None:
            res.unconverged += 1
            continue
        heal = r["heal"]
        deadline = r["t"] + bound

        def agrees(name, body):
            if name == "gone":
                return True
            if st[0] == "WAITING":
                return name == "ready" or (name == "waiting" and (body.get("rank") or 0) <= st[1])
            if st[0] == "READY":
                return name == "ready" and body.get("entryToken") == st[1]
            if st[0] == "PRE_QUEUE":
                return name in ("prequeue", "waiting", "ready")
            if st[0] == "ENDED":
                return False
            return True

        before = [e for e in p.events if e[0] <= heal]
        at = None
        if before and agrees(before[-1][1], before[-1][2]):
            at = heal
        else:
            at = next((e[0] for e in p.events if heal < e[0] <= deadline and agrees(e[1], e[2])),
                      None)
        if at is not None:
            # How long after the store said it the stream showed it (0 when
            # it already did): the store is read once, at the probe.
            res.convergence.append(max(0.0, at - r["t0"]))
            continue
        closed = p.closed_at is not None and p.closed_at <= deadline
        if closed or r["t"] + bound > (recs[-1]["t"] if recs else 0):
            res.unconverged += 1  # the buyer closed it, or the run ended first
            continue
        res.violate("convergence", f"{key}: the store said {st} at {r['t']:.3f} "
                    f"(heal at {heal:.3f}); the open stream did not show it within {bound} s",
                    [key], heal, deadline)


def print_result(r, out=sys.stdout):
    c = r["convergence"]
    print(f"kind {r['kind']} seed {r['seed']} ({r['seconds']} s, wait-replicas "
          f"{r['wait_replicas']}{', plant ' + r['plant'] if r.get('plant') else ''}): "
          f"{r['ops']} operations, faults {r['faults']}", file=out)
    print(f"  stats {r['stats']}; exceptions {r['exceptions']}; losses {r['losses'] or 'none'}",
          file=out)
    print(f"  convergence n={c['n']} p50={c['p50']} p99={c['p99']} max={c['max']} s "
          f"(bound {c['bound_s']} s, {c['unmeasured']} unmeasured)", file=out)
    if not r["violations"]:
        print("  no violation", file=out)
        return
    print(f"  {len(r['violations'])} VIOLATION(S); replay: {r['replay']}", file=out)
    print(f"  check again: python3 tests/faults/checker.py {r.get('history', '<history>')}",
          file=out)
    seen = set()
    for v in r["violations"]:
        if v["invariant"] in seen:
            continue  # the first of each kind, with its slice
        seen.add(v["invariant"])
        print(f"  [{v['invariant']}] {v['what']} (seed {r['seed']})", file=out)
        for rec in v["slice"]:
            print("     " + json.dumps(rec, sort_keys=True), file=out)


if __name__ == "__main__":
    result = check(sys.argv[1])
    result["history"] = sys.argv[1]
    print_result(result)
    sys.exit(1 if result["violations"] else 0)
