"""The checker's own tests: synthetic histories, each small enough to read,
for the rules whose cases came from real runs (docs/faults.md). Each rule
is tested both ways: what it must still call a violation, and what the
README allows.

  python3 -m unittest tests/faults/test_checker.py
"""

import base64
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import checker  # noqa: E402

BASE_W = 1_800_000_000_000  # wall ms at t = 0


def ticket(q, user, entry):
    raw = f"{q}\n{user}\n{entry}\n{BASE_W + 10**7}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=") + ".sig"


def rec(op, t, t0=None, **kw):
    r = {"op": op, "t": t, "w": BASE_W + int(t * 1000)}
    if t0 is not None:
        r.update(t0=t0, w0=BASE_W + int(t0 * 1000))
    r.update(kw)
    return r


def join(t0, t, user, entry, code, status, q="default", **body):
    return rec("join", t, t0, q=q, buyer=user, code=code, inst=0,
               body={"status": status, "ticket": ticket(q, user, entry), **body})


def poll(t0, t, user, entry, status, q="default", **body):
    return rec("poll", t, t0, q=q, buyer=user, entry=entry, code=200, inst=0,
               body={"status": status, **body})


def run(recs, wait=2):
    meta = rec("meta", 0.0, kind="sentinel", wait_replicas=wait, batch=2, interval_ms=300,
               token_ttl=4, abandon_after=12)
    recs = [meta] + recs
    res = checker.Result(meta, recs)
    places, epochs = checker.build_places(recs, res)
    checker.check_durability(places, meta, res)
    checker.mark_unanswered_lottery_joins(places, recs, res)
    checker.check_fifo(places, res, recs, wait)
    checker.check_rate(places, recs, meta, res, epochs)
    checker.check_exactly_once(places, recs, res)
    return res, places


def kinds(res):
    return sorted(v["invariant"] for v in res.violations)


class Acknowledgement(unittest.TestCase):
    """A READY only read, then WAITING: an unacknowledged admission read on
    a replaced master, counted; a READY from a published pass, then
    WAITING: an acknowledged admission lost, a violation."""

    def lost_after(self, ready):
        return [
            join(1.0, 1.01, "a", 1, 201, "WAITING"),
            ready,
            poll(3.0, 3.01, "a", 1, "WAITING", rank=0),
        ]

    def test_a_read_ready_then_waiting_is_counted_not_a_breach(self):
        res, _ = run(self.lost_after(poll(2.0, 2.01, "a", 1, "READY", entryToken="tok")))
        self.assertEqual(kinds(res), [])
        self.assertEqual(res.losses["unacknowledged admission read, then lost"], 1)

    def test_a_published_ready_then_waiting_is_a_durability_breach(self):
        ready = rec("event", 2.01, q="default", buyer="a", entry=1, event="ready", inst=0,
                    body={"status": "READY", "entryToken": "tok",
                          "admittedAt": BASE_W + 2000})
        res, _ = run(self.lost_after(ready))
        self.assertIn("durability", kinds(res))


class RepeatJoin(unittest.TestCase):
    """`201 READY` is a fast track made by that join; `200 READY` is a place
    an earlier, unanswered attempt made: its admission may be any time
    since that attempt."""

    def test_a_201_ready_is_a_fast_track_at_its_join(self):
        _, places = run([join(5.0, 5.02, "a", 1, 201, "READY", entryToken="t1")])
        p = places[("default", "a", 1)]
        self.assertTrue(p.fast_track)
        self.assertEqual(checker.admission_interval(p), (BASE_W + 5000, BASE_W + 5020))

    def test_a_200_ready_after_an_unanswered_attempt_spans_from_that_attempt(self):
        recs = [
            rec("join", 3.0, 1.0, q="default", buyer="a", code=503, inst=0,
                body={"error": "store_unavailable"}),
            join(5.0, 5.02, "a", 1, 200, "READY", entryToken="t1"),
        ]
        _, places = run(recs)
        p = places[("default", "a", 1)]
        self.assertFalse(p.fast_track)
        self.assertEqual(checker.admission_interval(p), (BASE_W + 1000, BASE_W + 5020))

    def test_many_fast_tracks_in_one_window_still_break_the_rate(self):
        recs = [join(5.0 + i * 0.01, 5.005 + i * 0.01, f"u{i}", i + 1, 201, "READY",
                     entryToken=f"t{i}") for i in range(20)]
        res, _ = run(recs)
        self.assertIn("rate", kinds(res))

    def test_repeat_joins_after_an_outage_are_not_placed_in_the_window(self):
        recs = []
        for i in range(20):
            recs.append(rec("join", 3.0, 1.0, q="default", buyer=f"u{i}", code=503, inst=0,
                            body={"error": "store_unavailable"}))
        recs += [join(5.0 + i * 0.01, 5.005 + i * 0.01, f"u{i}", i + 1, 200, "READY",
                      entryToken=f"t{i}") for i in range(20)]
        res, _ = run(recs)
        self.assertNotIn("rate", kinds(res))


class ConsumeLostInAFailover(unittest.TestCase):
    """A token claimed again after its consume: without WAIT, a master
    fault in between may have lost the consume (counted); with WAIT (a
    consume is answered only once replicas hold it) it is a breach."""

    def history(self):
        tok = "tok-a"
        return [
            join(1.0, 1.01, "a", 1, 201, "READY", entryToken=tok, tokenExpiresInSeconds=30),
            rec("claim", 2.01, 2.0, q="default", buyer="a", entry=1, code=200, inst=0,
                token=tok, body={"claimId": "c1.9"}),
            rec("consume", 2.11, 2.1, q="default", buyer="a", entry=1, code=204, inst=0,
                token=tok, claim="c1.9", body=None),
            rec("fault", 2.3, phase="start", id=1, fault="master_kill", target="redis:1"),
            rec("fault", 4.0, phase="end", id=1, fault="master_kill", target="redis:1"),
            rec("claim", 5.01, 5.0, q="default", buyer="a", entry=1, code=200, inst=0,
                token=tok, body={"claimId": "c2.9"}),
        ]

    def test_without_wait_it_is_counted(self):
        res, _ = run(self.history(), wait=0)
        self.assertEqual(kinds(res), [])
        self.assertEqual(res.exceptions["a consume lost in a failover without WAIT"], 1)

    def test_with_wait_it_is_a_breach(self):
        res, _ = run(self.history(), wait=2)
        self.assertEqual(kinds(res), ["exactly-once"])

    def test_without_wait_and_without_a_fault_it_is_a_breach(self):
        recs = [r for r in self.history() if r["op"] != "fault"]
        res, _ = run(recs, wait=0)
        self.assertEqual(kinds(res), ["exactly-once"])


class UnconfirmedReady(unittest.TestCase):
    """With WAIT, a READY only read (never published, never spent) may be
    an unacknowledged admission on a replaced master: it proves nothing
    for FIFO. The same READY with its token spent is an admission."""

    def history(self, spent):
        recs = [
            join(1.0, 1.01, "a", 1, 201, "WAITING"),
            join(1.1, 1.11, "b", 2, 201, "WAITING"),
            poll(2.0, 2.01, "b", 2, "READY", entryToken="tb", tokenExpiresInSeconds=4),
            poll(2.5, 2.51, "a", 1, "WAITING", rank=0),
        ]
        if spent:
            recs.append(rec("claim", 2.61, 2.6, q="default", buyer="b", entry=2, code=200,
                            inst=0, token="tb", body={"claimId": "c.1"}))
        return recs

    def test_a_read_only_ready_is_not_proof(self):
        res, _ = run(self.history(spent=False), wait=2)
        self.assertEqual(kinds(res), [])

    def test_a_spent_ready_is(self):
        res, _ = run(self.history(spent=True), wait=2)
        self.assertEqual(kinds(res), ["fifo"])

    def test_without_wait_any_ready_is(self):
        res, _ = run(self.history(spent=False), wait=0)
        self.assertEqual(kinds(res), ["fifo"])


class HeldRestock(unittest.TestCase):
    """Units sold past a restock: a breach, unless a restock that went
    unanswered (an instance paused with it in hand) may have landed after
    it and reset the stock again."""

    def history(self, unanswered):
        recs = []
        if unanswered:
            recs.append(rec("restock", 5.0, 0.5, op_product="p", stock=3, code=None, inst=0,
                            err="TimeoutError"))
        recs.append(rec("restock", 6.01, 6.0, stock=3, code=200, inst=1,
                        body={"queue": "default", "stock": 3}))
        for i in range(4):
            tok = f"t{i}"
            recs += [join(1.0 + i * 0.01, 1.005 + i * 0.01, f"u{i}", i + 1, 201, "READY",
                          entryToken=tok, tokenExpiresInSeconds=30),
                     rec("order", 7.01 + i, 7.0 + i, q="default", buyer=f"u{i}", entry=i + 1,
                         code=201, inst=1, token=tok, qty=1, body={"status": "CONFIRMED"})]
        return recs

    def test_more_sold_than_restocked_is_a_breach(self):
        res, _ = run(self.history(unanswered=False))
        self.assertEqual(kinds(res), ["exactly-once"])

    def test_not_while_an_unanswered_restock_may_still_land(self):
        res, _ = run(self.history(unanswered=True))
        self.assertEqual(kinds(res), [])


class LotteryDraw(unittest.TestCase):
    """A repeat join whose unanswered attempt was sent while the draw was
    pending may be a lottery entrant: compared with nobody. Without such
    an attempt, the same order is a FIFO breach."""

    def history(self, attempt_t0):
        sched = rec("schedule_lottery", 1.01, 1.0, q="drop", code=200, inst=0,
                    body={"state": "scheduled"}, opensAt=BASE_W + 2000)
        early = join(1.5, 1.51, "early", 1, 201, "PRE_QUEUE", q="drop")
        drawn = poll(3.0, 3.01, "early", 1, "WAITING", q="drop", rank=3)
        late = [rec("join", attempt_t0 + 0.5, attempt_t0, q="drop", buyer="late", code=503,
                    inst=0, body={"error": "store_unavailable"}),
                join(6.0, 6.01, "late", 9, 200, "READY", q="drop", entryToken="tl"),
                # Spent: a confirmed admission, not a read of a lost one.
                rec("claim", 6.11, 6.1, q="drop", buyer="late", entry=9, code=200, inst=0,
                    token="tl", body={"claimId": "c.1"})]
        # The buyer ahead still waits after the late one was seen READY.
        ahead = [join(2.5, 2.51, "ahead", 5, 201, "WAITING", q="drop"),
                 poll(6.5, 6.51, "ahead", 5, "WAITING", q="drop", rank=0)]
        return [sched, early, drawn] + ahead + late

    def test_an_attempt_during_the_draw_makes_the_place_uncomparable(self):
        res, places = run(self.history(attempt_t0=2.5))
        self.assertTrue(places[("drop", "late", 9)].lottery_unknown)
        self.assertEqual(kinds(res), [])

    def test_an_attempt_after_the_draw_is_ordered_as_any_join(self):
        res, places = run(self.history(attempt_t0=4.0))
        self.assertFalse(places[("drop", "late", 9)].lottery_unknown)
        self.assertIn("fifo", kinds(res))


if __name__ == "__main__":
    unittest.main()
