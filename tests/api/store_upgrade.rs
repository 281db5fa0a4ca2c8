//! What an earlier version left in Redis keeps working after an upgrade
//! (instances are replaced one at a time, the line stays in Redis):
//! entry-time marks in the earlier layout (spans of 128 entry ids under
//! `~`, the last mark without its `^`) are still read and dropped as the
//! line moves on, and so are the oldest layout's entry times kept per
//! user, a queue sold out before the sold-out flag had its
//! STRING copy reads as sold out from the next admission pass on, and
//! entry tokens kept in a HASH each (the earlier token layout) are read,
//! claimed, used and given up until they expire, moving to the queue's
//! token HASH when written.

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use waitroom::queue::{EntryToken, Policy, QueueName, Snapshot, Standing, StockReport, UserId};
use waitroom::store::redis::RedisStore;
use waitroom::store::{ClaimOutcome, ClaimStore, LineStore, StockStore};

use crate::common::{redis_url, unique_prefix};

fn user(name: &str) -> UserId {
    UserId::parse(name).unwrap()
}

/// A line that never fast-tracks (nobody may hold a token) and admits
/// `batch` a pass, nobody dropped as absent.
fn policy(batch: u32) -> Policy {
    Policy {
        batch,
        interval_ms: 1,
        token_ttl_ms: 60_000,
        max_active: Some(0),
        abandon_after_ms: None,
    }
}

async fn join(store: &RedisStore, q: &QueueName, who: &str) -> Snapshot {
    store
        .enter(q, &user(who), &policy(1), &EntryToken::generate())
        .await
        .unwrap()
        .snapshot
}

/// Admits `n` from the head (room for them: max active lifted).
async fn admit(store: &RedisStore, q: &QueueName, n: u32) -> usize {
    let open = Policy {
        max_active: None,
        ..policy(n)
    };
    admit_under(store, q, &open).await
}

/// One pass under `policy` (a token for each of its batch): how many it
/// admitted.
async fn admit_under(store: &RedisStore, q: &QueueName, policy: &Policy) -> usize {
    let tokens: Vec<EntryToken> = (0..policy.batch).map(|_| EntryToken::generate()).collect();
    store
        .admit(q, policy, &tokens)
        .await
        .unwrap()
        .admitted
        .len()
}

fn entered_at(s: &Snapshot) -> u64 {
    assert!(matches!(s.standing, Standing::Waiting { .. }), "{s:?}");
    s.entered_at_ms.expect("an entry time")
}

/// A store of a prefix of its own on the shared Redis, its queue
/// `default`, a plain connection to write what an earlier version left,
/// and the queue's key base.
async fn fresh(tag: &str) -> (RedisStore, QueueName, MultiplexedConnection, String) {
    let prefix = unique_prefix(tag);
    let store = RedisStore::connect(&redis_url(), &prefix).await.unwrap();
    let conn = redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let base = format!("{prefix}:{{default}}:");
    (store, QueueName::parse("default").unwrap(), conn, base)
}

#[tokio::test]
async fn marks_of_the_earlier_layout_are_read_and_dropped() {
    crate::needs_redis!();
    let (store, q, mut conn, base) = fresh("upgrade-marks").await;
    let entered = format!("{base}entered");

    // 300 buyers, then their marks rewritten as an earlier version kept
    // them: one field per 128 entry ids, each entry a mark of its own, a
    // time of our choosing so the test can tell them from fresh ones.
    let mut entries = Vec::new();
    for i in 0..300 {
        let s = join(&store, &q, &format!("old{i:03}")).await;
        entries.push(s.entry.unwrap());
    }
    let _: () = conn.del(&entered).await.unwrap();
    let t0: u64 = 1_700_000_000_000;
    let mut spans: std::collections::BTreeMap<u64, Vec<(u64, u64)>> = Default::default();
    for (i, e) in entries.iter().enumerate() {
        spans
            .entry(e / 128)
            .or_default()
            .push((e % 128, t0 + i as u64 * 7));
    }
    for (span, marks) in &spans {
        let first = marks[0].1;
        let mut text = format!("{},{first}", marks[0].0);
        for (o, t) in &marks[1..] {
            text.push_str(&format!(" {o},{}", t - first));
        }
        let _: () = conn.hset(&entered, format!("~{span}"), text).await.unwrap();
    }
    let lowest = *spans.keys().next().unwrap();
    let _: () = conn.hset(&entered, "~lo", lowest).await.unwrap();
    let last = entries.last().unwrap();
    let _: () = conn
        .set(format!("{base}seq:mark"), format!("{},{}", last / 128, t0))
        .await
        .unwrap();

    // Read as written, whichever span.
    for i in [0usize, 1, 127, 128, 200, 299] {
        let s = store
            .status(&q, &user(&format!("old{i:03}")), false)
            .await
            .unwrap();
        assert_eq!(entered_at(&s), t0 + i as u64 * 7, "old{i:03}");
    }

    // A join after the upgrade: the store clock's time, in the new layout.
    let fresh = join(&store, &q, "new000").await;
    let now = entered_at(&fresh);
    assert!(now > t0 + 1_000_000, "{fresh:?}");
    let again = store.status(&q, &user("new000"), false).await.unwrap();
    assert_eq!(entered_at(&again), now);
    let fields: Vec<String> = conn.hkeys(&entered).await.unwrap();
    assert!(fields.iter().any(|f| f.starts_with('^')), "{fields:?}");

    // Admission keeps the spans the head passed while its tokens may live
    // (each holder's time is read from them when asked), and the rest keep
    // their times.
    assert_eq!(admit_for(&store, &q, 200, LIFE).await, 200);
    for i in [0usize, 127, 199] {
        let s = store
            .status(&q, &user(&format!("old{i:03}")), false)
            .await
            .unwrap();
        assert_eq!(held_since(&s), t0 + i as u64 * 7, "old{i:03}'s token");
    }
    let fields: Vec<String> = conn.hkeys(&entered).await.unwrap();
    assert!(
        fields.contains(&format!("~{lowest}")),
        "kept for its holders: {fields:?}"
    );
    assert_eq!(admit_for(&store, &q, 100, LIFE).await, 100);
    let s = store.status(&q, &user("old250"), false).await.unwrap();
    assert_eq!(held_since(&s), t0 + 250 * 7);
    assert_eq!(
        entered_at(&store.status(&q, &user("new000"), false).await.unwrap()),
        now
    );

    // Once those tokens have expired, only the old span the head is in is
    // left (the spans go as the head passes them).
    settle(&store, &q).await;
    let fields: Vec<String> = conn.hkeys(&entered).await.unwrap();
    let head_span = format!("~{}", fresh.entry.unwrap() / 128);
    assert!(
        !fields.contains(&format!("~{lowest}")),
        "the passed span is dropped: {fields:?}"
    );
    assert!(
        fields
            .iter()
            .all(|f| !f.starts_with('~')
                || ["~seen", "~lo", head_span.as_str()].contains(&f.as_str())),
        "no old span the head passed is left: {fields:?}"
    );
    assert_eq!(
        entered_at(&store.status(&q, &user("new000"), false).await.unwrap()),
        now
    );
    // Buyers joined after the upgrade alone: once the head passes two
    // spans of 128 of theirs, no span of the old layout is left (its
    // lowest, '~lo', goes when a pass finds none left below the head).
    for i in 1..=300 {
        join(&store, &q, &format!("new{i:03}")).await;
    }
    assert_eq!(admit_for(&store, &q, 140, LIFE).await, 140);
    assert_eq!(admit_for(&store, &q, 130, LIFE).await, 130);
    settle(&store, &q).await;
    let fields: Vec<String> = conn.hkeys(&entered).await.unwrap();
    assert!(
        fields
            .iter()
            .all(|f| !f.starts_with('~') || f == "~seen" || f == "~lo"),
        "the old layout's spans are gone: {fields:?}"
    );
    let s = store.status(&q, &user("new299"), false).await.unwrap();
    assert!(entered_at(&s) >= now);

    // An empty line: its last holders still read their times, and once
    // their tokens expire nothing of the marks is left.
    assert_eq!(admit_for(&store, &q, 50, LIFE).await, 31);
    let s = store.status(&q, &user("new299"), false).await.unwrap();
    assert!(held_since(&s) >= now, "{s:?}");
    settle(&store, &q).await;
    let left: bool = conn.exists(&entered).await.unwrap();
    assert!(!left, "the marks go with the line and its holders");
}

/// How long the tokens of the passes that test the marks' clean-up live.
const LIFE: u64 = 1_000;

/// One pass admitting up to `n`, its tokens living `life_ms`: how many it
/// admitted.
async fn admit_for(store: &RedisStore, q: &QueueName, n: u32, life_ms: u64) -> usize {
    let open = Policy {
        max_active: None,
        token_ttl_ms: life_ms,
        ..policy(n)
    };
    admit_under(store, q, &open).await
}

/// Passes admitting nobody, each after the tokens of the pass before it
/// expired (LIFE): the marks of every entry that left the line before the
/// first go (the first pass frees those its tokens held, the second those
/// of the passes since).
async fn settle(store: &RedisStore, q: &QueueName) {
    for _ in 0..2 {
        tokio::time::sleep(std::time::Duration::from_millis(LIFE + 100)).await;
        let pass = store.admit(q, &policy(1), &[]).await.unwrap();
        assert!(pass.admitted.is_empty(), "{pass:?}");
    }
}

/// The entry time a holder's answer shows.
fn held_since(s: &Snapshot) -> u64 {
    assert!(matches!(s.standing, Standing::Ready { .. }), "{s:?}");
    s.entered_at_ms.expect("an entry time")
}

/// The oldest layout kept each waiting buyer's entry time in a field
/// named by the user. Such a time is read by a poll and an admission
/// pass (into the token's record), and its field goes as its user leaves
/// the line: admitted, leaving, or dropped as absent; buyers marked since
/// have no such field, so a pass deletes none for them.
#[tokio::test]
async fn entry_times_kept_per_user_are_read_and_go_with_their_users() {
    crate::needs_redis!();
    let (store, q, mut conn, base) = fresh("upgrade-per-user").await;
    let entered = format!("{base}entered");
    let mut entries = Vec::new();
    for i in 0..40 {
        entries.push(join(&store, &q, &format!("old{i:03}")).await.entry.unwrap());
    }
    // What the oldest version left: a field per user, no marks, no last
    // mark beside the counter.
    let _: () = conn
        .del(&[&entered, &format!("{base}seq:mark")])
        .await
        .unwrap();
    let t0: u64 = 1_700_000_000_000;
    for i in 0..40u64 {
        let _: () = conn
            .hset(&entered, format!("old{i:03}"), t0 + i * 5)
            .await
            .unwrap();
    }
    for i in 0..10 {
        join(&store, &q, &format!("new{i:03}")).await;
    }
    for i in [0u64, 17, 39] {
        let s = store
            .status(&q, &user(&format!("old{i:03}")), false)
            .await
            .unwrap();
        assert_eq!(entered_at(&s), t0 + i * 5, "old{i:03}");
    }

    // A pass of 25: each token records its buyer's own time, and their
    // fields are gone; those behind them keep theirs.
    assert_eq!(admit(&store, &q, 25).await, 25);
    for i in [0u64, 24] {
        let s = store
            .status(&q, &user(&format!("old{i:03}")), false)
            .await
            .unwrap();
        assert!(matches!(s.standing, Standing::Ready { .. }), "{s:?}");
        assert_eq!(s.entered_at_ms, Some(t0 + i * 5), "old{i:03}'s token");
    }
    let mut kept: Vec<String> = conn.hkeys(&entered).await.unwrap();
    kept.retain(|f| f.starts_with("old"));
    kept.sort();
    let behind: Vec<String> = (25..40).map(|i| format!("old{i:03}")).collect();
    assert_eq!(kept, behind, "the admitted buyers' fields go with them");

    // Leaving takes the field with the place.
    assert!(store.leave(&q, &user("old030"), entries[30]).await.unwrap());
    let kept: bool = conn.hexists(&entered, "old030").await.unwrap();
    assert!(!kept, "old030 left");

    // Not seen for a minute, by their own field's time: dropped as absent
    // at the next pass, fields and all, where the buyers who joined since
    // entered now and stay.
    let sweeping = Policy {
        abandon_after_ms: Some(60_000),
        ..policy(1)
    };
    let pass = store
        .admit(&q, &sweeping, &[EntryToken::generate()])
        .await
        .unwrap();
    let mut dropped: Vec<String> = pass
        .abandoned
        .iter()
        .map(|a| a.user.as_str().to_owned())
        .collect();
    dropped.sort();
    let absent: Vec<String> = (25..40)
        .filter(|i| *i != 30)
        .map(|i| format!("old{i:03}"))
        .collect();
    assert_eq!(dropped, absent, "{pass:?}");
    let fields: Vec<String> = conn.hkeys(&entered).await.unwrap();
    assert!(
        fields.iter().all(|f| !f.starts_with("old")),
        "no field of the oldest layout is left: {fields:?}"
    );
    assert_eq!(store.stats(&q).await.unwrap().waiting, 10);
}

#[tokio::test]
async fn a_queue_sold_out_before_the_flag_had_its_copy_reads_sold_out_after_a_pass() {
    crate::needs_redis!();
    let (store, q, mut conn, base) = fresh("upgrade-sold").await;
    let stock = format!("{base}stock");

    join(&store, &q, "a").await;
    join(&store, &q, "b").await;
    store
        .set_stock(
            &q,
            StockReport {
                remaining: 0,
                per_buyer: 1,
            },
        )
        .await
        .unwrap();
    let polled = store.status(&q, &user("b"), false).await.unwrap();
    assert!(polled.sold_out, "a report reaches the poll at once");

    // As an earlier version left it: the flag in the hash, no copy.
    let _: () = conn.del(format!("{stock}:soldout")).await.unwrap();
    let polled = store.status(&q, &user("b"), false).await.unwrap();
    assert!(!polled.sold_out, "the poll reads the copy alone");
    assert_eq!(admit(&store, &q, 1).await, 0, "sold out: nobody admitted");
    let polled = store.status(&q, &user("b"), false).await.unwrap();
    assert!(polled.sold_out, "the pass set the copy right");

    // Restocked: the copy goes with the flag, and the pass leaves it so.
    store
        .set_stock(
            &q,
            StockReport {
                remaining: 5,
                per_buyer: 1,
            },
        )
        .await
        .unwrap();
    assert!(!store.status(&q, &user("b"), false).await.unwrap().sold_out);
    let _: () = conn.set(format!("{stock}:soldout"), "1").await.unwrap();
    admit(&store, &q, 1).await;
    assert!(!store.status(&q, &user("b"), false).await.unwrap().sold_out);
}

/// Moves `who`'s token from the queue's token HASH to the earlier layout:
/// a HASH of its own (token, enteredAt, exp, entry, claim, claimUntil,
/// expiring at exp) and a STRING `#<sha1(token)>` naming its holder.
async fn to_earlier_layout(conn: &mut MultiplexedConnection, prefix: &str, base: &str, who: &str) {
    let t = crate::common::stored_token(conn, prefix, "default", who)
        .await
        .unwrap()
        .expect("a token to move");
    let sha: String = redis::cmd("EVAL")
        .arg("return redis.sha1hex(ARGV[1])")
        .arg(0)
        .arg(&t["token"])
        .query_async(conn)
        .await
        .unwrap();
    let tokens = format!("{base}token:#tokens");
    let _: () = conn
        .hdel(&tokens, &[who.to_owned(), format!("#{}", t["token"])])
        .await
        .unwrap();
    let key = format!("{base}token:{who}");
    let mut fields = vec![("token", &t["token"]), ("exp", &t["exp"])];
    fields.push(("enteredAt", &t["enteredAt"]));
    fields.push(("entry", &t["entry"]));
    let _: () = conn.hset_multiple(&key, &fields).await.unwrap();
    let _: () = redis::cmd("PEXPIREAT")
        .arg(&key)
        .arg(&t["exp"])
        .query_async(conn)
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(format!("{base}token:#{sha}"))
        .arg(who)
        .arg("PXAT")
        .arg(&t["exp"])
        .query_async(conn)
        .await
        .unwrap();
}

fn ready_token(s: &Snapshot) -> String {
    match &s.standing {
        Standing::Ready { token, .. } => token.as_str().to_owned(),
        other => panic!("not ready: {other:?}"),
    }
}

#[tokio::test]
async fn tokens_of_the_earlier_layout_work_until_they_expire_and_move_when_written() {
    crate::needs_redis!();
    let (store, q, mut conn, base) = fresh("upgrade-tokens").await;
    let prefix = base.strip_suffix(":{default}:").unwrap().to_owned();
    for who in ["a", "b", "c", "d"] {
        join(&store, &q, who).await;
    }
    assert_eq!(admit(&store, &q, 4).await, 4);
    let mut tokens = std::collections::HashMap::new();
    for who in ["a", "b", "c", "d"] {
        let s = store.status(&q, &user(who), false).await.unwrap();
        tokens.insert(who, (ready_token(&s), s.entry.unwrap()));
        to_earlier_layout(&mut conn, &prefix, &base, who).await;
    }
    let all: u64 = conn.hlen(format!("{base}token:#tokens")).await.unwrap();
    assert_eq!(all, 0, "every token is in the earlier layout now");

    // Read: a poll, the stream re-read, a repeat join, the token API's
    // look-up by the token alone.
    for who in ["a", "b", "c", "d"] {
        let s = store.status(&q, &user(who), false).await.unwrap();
        assert_eq!(ready_token(&s), tokens[who].0, "{who}");
        assert_eq!(s.entry, Some(tokens[who].1), "{who}");
    }
    let many = store
        .statuses(&q, &[user("a"), user("b"), user("zz")])
        .await
        .unwrap();
    assert_eq!(ready_token(&many[0]), tokens["a"].0);
    assert_eq!(ready_token(&many[1]), tokens["b"].0);
    assert_eq!(many[2].standing, Standing::NotEntered);
    let again = join(&store, &q, "c").await;
    assert_eq!(
        ready_token(&again),
        tokens["c"].0,
        "a holder joining again keeps the token"
    );
    assert_eq!(
        store.token_holder(&q, &tokens["a"].0).await.unwrap(),
        Some(user("a"))
    );

    // Written: a claim moves the token into the HASH (its own key gone),
    // where a consume ends it.
    let claim_id = match store
        .claim(&q, &user("a"), &tokens["a"].0, 30_000)
        .await
        .unwrap()
    {
        ClaimOutcome::Claimed { claim_id } => claim_id,
        other => panic!("{other:?}"),
    };
    let moved = crate::common::stored_token(&mut conn, &prefix, "default", "a")
        .await
        .unwrap()
        .expect("moved into the HASH");
    assert_eq!(moved["token"], tokens["a"].0);
    assert_eq!(moved["claim"], claim_id);
    let old: bool = conn.exists(format!("{base}token:a")).await.unwrap();
    assert!(!old, "the earlier key is gone once moved");
    assert_eq!(
        store.token_holder(&q, &tokens["a"].0).await.unwrap(),
        Some(user("a")),
        "found by the token alone after the move"
    );
    assert!(store.consume(&q, &user("a"), &claim_id).await.unwrap());
    assert_eq!(
        store.status(&q, &user("a"), false).await.unwrap().standing,
        Standing::NotEntered
    );
    assert_eq!(store.token_holder(&q, &tokens["a"].0).await.unwrap(), None);

    // A claim, its release and a consume of the earlier layout in place
    // of the claim: the released token is READY again.
    let claim_id = match store
        .claim(&q, &user("b"), &tokens["b"].0, 30_000)
        .await
        .unwrap()
    {
        ClaimOutcome::Claimed { claim_id } => claim_id,
        other => panic!("{other:?}"),
    };
    assert!(store.release(&q, &user("b"), &claim_id).await.unwrap());
    let s = store.status(&q, &user("b"), false).await.unwrap();
    assert_eq!(ready_token(&s), tokens["b"].0);

    // Given up: a leave drops the earlier key and the active slot.
    assert!(store.leave(&q, &user("d"), tokens["d"].1).await.unwrap());
    let old: bool = conn.exists(format!("{base}token:d")).await.unwrap();
    assert!(!old);
    assert_eq!(
        store.status(&q, &user("d"), false).await.unwrap().standing,
        Standing::NotEntered
    );
    let active: u64 = conn.zcard(format!("{base}active")).await.unwrap();
    assert_eq!(active, 2, "b and c hold tokens, a and d gave theirs up");
}

#[tokio::test]
async fn expired_tokens_leave_the_token_hash_with_their_index() {
    crate::needs_redis!();
    let (store, q, mut conn, base) = fresh("expired-tokens").await;
    let tokens = format!("{base}token:#tokens");
    let short = Policy {
        token_ttl_ms: 300,
        max_active: None,
        ..policy(3)
    };
    for who in ["a", "b", "c", "d"] {
        join(&store, &q, who).await;
    }
    assert_eq!(admit_under(&store, &q, &short).await, 3);
    let fields: u64 = conn.hlen(&tokens).await.unwrap();
    assert_eq!(fields, 6, "a record and an index field per token");
    // b's claim outlives the token's TTL: its token stays past it.
    let b = ready_token(&store.status(&q, &user("b"), false).await.unwrap());
    let claim_id = match store.claim(&q, &user("b"), &b, 5_000).await.unwrap() {
        ClaimOutcome::Claimed { claim_id } => claim_id,
        other => panic!("{other:?}"),
    };
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    // A pass drops the expired ones (d is admitted by it: a new token).
    assert_eq!(admit_under(&store, &q, &short).await, 1);
    let mut left: Vec<String> = conn.hkeys(&tokens).await.unwrap();
    left.retain(|f| !f.starts_with('#'));
    left.sort();
    assert_eq!(left, ["b", "d"], "the expired tokens are gone");
    let fields: u64 = conn.hlen(&tokens).await.unwrap();
    assert_eq!(fields, 4, "their index fields with them");
    assert_eq!(store.token_holder(&q, &b).await.unwrap(), Some(user("b")));
    assert!(store.consume(&q, &user("b"), &claim_id).await.unwrap());
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    assert_eq!(admit_under(&store, &q, &short).await, 0, "nobody waits");
    let fields: u64 = conn.hlen(&tokens).await.unwrap();
    assert_eq!(fields, 0, "nothing is left once every token ended");
}

/// The last mark beside the counter is trusted only when it names the
/// span the join falls in, in the current layout: a value naming another
/// span whose number starts with this one's digits (`^` + the span + `0`),
/// or one without the `^` (an earlier version's), with a time far ahead of
/// the clock, does not lend a join that time; and a join a millisecond or
/// more after a trusted mark of its span gets its own time, kept in the
/// marks, so reads agree with the join.
#[tokio::test]
async fn a_last_mark_of_another_span_or_layout_lends_no_time() {
    crate::needs_redis!();
    let (store, q, mut conn, base) = fresh("upgrade-last-mark").await;
    let mark_key = format!("{base}seq:mark");
    let first = join(&store, &q, "m0").await;
    let t0 = entered_at(&first);
    let mark: String = conn.get(&mark_key).await.unwrap();
    let (span, time) = mark
        .strip_prefix('^')
        .and_then(|m| m.split_once(','))
        .expect("the last mark, ^span,ms");
    assert_eq!(time.parse::<u64>().unwrap(), t0, "the first join's mark");
    let ahead = t0 + 3_600_000;
    for (i, planted) in [format!("^{span}0,{ahead}"), format!("{span},{ahead}")]
        .into_iter()
        .enumerate()
    {
        let _: () = conn.set(&mark_key, &planted).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
        let who = format!("m{}", i + 1);
        let joined = entered_at(&join(&store, &q, &who).await);
        assert!(
            joined > t0 && joined < ahead,
            "{who} after {planted:?}: entered at {joined}, t0 {t0}"
        );
        let read = store.status(&q, &user(&who), false).await.unwrap();
        assert_eq!(entered_at(&read), joined, "{who} read back");
    }
    // Trusted now (written by the last join): later joins get their own
    // times, later than the last, each read back as joined.
    let mut last = 0;
    for i in 3..8 {
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        let who = format!("m{i}");
        let joined = entered_at(&join(&store, &q, &who).await);
        assert!(joined > last && joined < ahead, "{who}: {joined}");
        let read = store.status(&q, &user(&who), false).await.unwrap();
        assert_eq!(entered_at(&read), joined, "{who} read back");
        last = joined;
    }
    for i in 0..8 {
        let who = format!("m{i}");
        let read = store.status(&q, &user(&who), false).await.unwrap();
        assert!(entered_at(&read) < ahead, "{who}");
    }
}
