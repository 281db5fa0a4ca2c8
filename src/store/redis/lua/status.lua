-- status.lua: one user's standing, token first; optionally marks them seen;
-- optionally spends one from the user's request budget first.
-- KEYS[1..8], ARGV[1..2]: see common.lua.   KEYS[9] the user's token key of the
--          earlier layout (common.lua)
-- KEYS[10] the user's budget (STRING, see gcra.lua; in the queue's hash tag)
-- KEYS[11] the queue's stock HASH (see common.lua; its sold-out flag is
--          read from the STRING beside it, sold_out_key)
-- ARGV[3] user   ARGV[4] touch (1/0)
-- ARGV[5] budget period ms (0: no budget)   ARGV[6] budget burst
-- ARGV[7], ARGV[8] an entry id and its time the caller holds from an
--          earlier answer ('' and '': none): when the user waits with that
--          entry, or holds a token issued to it, its time is that one and
--          its marks are not read
-- Returns describe(): {kind, created(0), rank, entry, token, ttl_ms, entered_at, total, pass, soldout},
-- a 'none' row followed by the queue's entry counter (KEYS[2]; -1: none),
-- or limited('buyer', ms to wait) with nothing touched. The counter lets the
-- caller tell "your place is over" from "this node never saw your entry": a
-- ticket whose entry is above it was issued by a store this node lags
-- behind (a restarted old master read before a failover settles), so it
-- must not be told its place ended. Read only when the user holds no
-- place: the line's common path (the head) pays nothing for it.
-- Cost: a buyer in line (the common case) costs 7 commands: TIME, MGET,
-- the budget's SET, ZSCORE, ZRANK, the entry time's HGET (its span's
-- marks, at most 16: none with ARGV[7..8], the HTTP layer's polls after
-- the first), ZCARD; and presence's ZADD only with touch (the HTTP layer
-- polls without: its presence loop marks polling buyers seen in one write
-- with the streaming ones, crate::push). A holder costs 6: TIME, MGET,
-- SET, ZSCORE, the token's HGET, ZCARD; and the marks' HGET when the
-- caller holds no time for the token's entry.
-- Atomic so the token look-up and the rank are read at one instant: read
-- apart, a user admitted in between would look NOT_ENTERED; the budget is
-- spent in the same step so a poll stays one round trip and every
-- instance counts against one budget.
local user = ARGV[3]
-- The queue's keys by name (K, common.lua, is made after the head).
local waiting_key, pass_key, paused_key = KEYS[1], KEYS[7], KEYS[8]
local now = now_ms()
local period = ARGV[5] + 0
-- The budget, the pass counter, the hold and the sold-out flag: the
-- STRINGs, in one MGET.
local v = redis.call('MGET', KEYS[10], pass_key, paused_key, sold_out_key(KEYS[11]))
if period > 0 then
  local wait = gcra_stored(KEYS[10], v[1], now, period, ARGV[6] + 0)
  if wait > 0 then
    return limited('buyer', wait)
  end
end
local pass, held = v[2] and v[2] + 0 or 0, v[3] and 2 or 0
-- A buyer in line (the common case) holds no token (admission takes its
-- buyers out of the line as it issues theirs, and a join puts nobody who
-- holds one in line), so their score alone says they wait: the line
-- answers, each of its reads once, before the helpers below are made (a
-- closure each, per call).
local score = redis.call('ZSCORE', waiting_key, user)
if score then
  local seq = score + 0
  local soldout = v[4] and 1 or 0
  if ARGV[4] == '1' then
    seen_now(user, now)
  end
  -- The entry id as the line printed it against the caller's, as text.
  local entered
  if score == ARGV[7] then
    entered = ARGV[8] + 0
  else
    entered = entered_at(user, seq) or -1
  end
  return {'waiting', 0, redis.call('ZRANK', waiting_key, user), seq, '', -1,
          entered, redis.call('ZCARD', waiting_key), pass, held + soldout}
end
-- A holder (the page polling once its buyer is let in): a live token
-- answers here too, before the helpers. Its entry time: the token's, or
-- (an admission pass writes none) the one the caller holds for that
-- entry (ARGV[7..8]), else the marks kept for holders (trim_marks).
local rec = redis.call('HGET', tokens_key(), user)
local t = rec and token_record(rec)
if t and t.exp > now then
  local entered = t.entered < 0 and t.entry_s == ARGV[7] and ARGV[8] + 0
    or token_entered(user, t) or -1
  return {'ready', 0, -1, t.entry, t.token, t.exp - now, entered,
          redis.call('ZCARD', waiting_key), pass, held + (v[4] and 1 or 0)}
end
--@helpers
-- Not in line, no live token: no token and no stock (one EXISTS) is a
-- 'none'; else the token answers (one of the earlier layout, or an
-- expired one as describe() reads it). A 'none' row carries the entry
-- counter (one GET).
if not t then
  -- Neither a token of the earlier layout nor a stock: nobody.
  if redis.call('EXISTS', K.token, KEYS[11]) == 0 then
    return {'none', 0, -1, -1, '', -1, -1, redis.call('ZCARD', K.waiting), pass, held,
            tonumber(redis.call('GET', K.seq) or '-1')}
  end
  t = old_token(K.token)
end
local row = describe(user, t, now, 0, redis.call('ZCARD', K.waiting), pass, true)
row[#row + 1] = (v[4] and 1 or 0) + held
if row[1] == 'none' then
  row[#row + 1] = tonumber(redis.call('GET', K.seq) or '-1')
end
return row
