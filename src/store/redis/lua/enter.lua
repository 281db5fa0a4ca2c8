-- enter.lua: put a user in line, or keep the place or token they have,
-- checked against the buyer's and the client address's limits (see
-- join.lua, which does the work).
-- KEYS[1..8], ARGV[1..2]: see common.lua. All in the queue's hash tag:
-- KEYS[9]  the user's token key of the earlier layout (common.lua)
-- KEYS[10] the user's request budget (STRING, see gcra.lua)
-- KEYS[11] the queue's stock HASH (see common.lua): no fast track past it
-- KEYS[12] the queue's audit STREAM (common.lua): fast-track admissions
-- KEYS[13] the lottery HASH, KEYS[14] the pre-queue HASH (see
--          lottery_schedule.lua): a join answers 'prequeue' before a draw
-- KEYS[15] the client address's join rate (STRING, see gcra.lua) and
-- KEYS[16] its places (ZSET user -> entry id): sent only when the address
--          has limits (join_config's address join period or places above
--          zero); absent, the join has none
-- ARGV[3..4]  the user and the fast-track token
-- ARGV[5]     the join's further arguments, packed as join.lua's join_config reads them,
--             then, when the caller holds the user's entry and its time as
--             the store answered them earlier, '|entry,ms|': a buyer in line
--             with that entry joining again has that time, not the marks'
--             (not read)
-- ARGV[6]     sent only by a grouping task (batch.rs) for a group of one
--             join: the group's number in the task's order; the last key
--             is then the task's fence (overtaken, join.lua), after the
--             address's keys when they are sent
-- ARGV[7]     'read' (with ARGV[6]): the fence is only read, in the
--             call's first MGET (or a GET of its own past the lean head),
--             not written: no earlier call of the task can follow this
--             one (batch.rs)
-- Returns join()'s row: describe(), or limited(...) changing nothing; or
-- 'overtaken', changing nothing, for a group a later one overtook.
-- Atomic for the reasons join.lua gives.
-- Cost: a lean head (up to --@helpers, see scripts.rs) answers a new
-- buyer behind a line (8 commands: TIME, EXISTS, ZSCORE, the token
-- HASH's HEXISTS, ZCARD, MGET, the counter's SET or MSET, ZADD; a mark's
-- HGET and HSET when the span or millisecond is new) and a buyer in line
-- joining again (9; 8 with their entry's time known, no marks' HGET)
-- before the join helpers' closures are made; a group
-- of one adds the fence's SET, or reads it with the MGET it makes anyway.
local fence_read = ARGV[7] ~= nil
if ARGV[6] and not fence_read and overtaken(KEYS[#KEYS], ARGV[6]) then
  return 'overtaken'
end
local now = now_ms()
local user = ARGV[3]
-- The address's keys, KEYS[15..16], sent only when it has limits (a
-- fence comes after them, so KEYS[16] exists only with them).
local joins_key, places_key = KEYS[16] and KEYS[15], KEYS[16]
-- The queue's keys by name (K, common.lua, is made after the head).
local waiting_key, seq_key, pass_key, paused_key = KEYS[1], KEYS[2], KEYS[7], KEYS[8]
-- The common case in three reads at most: no token, no lottery, no stock
-- (one EXISTS, and the token HASH's HEXISTS for a buyer not in line:
-- join's repeat check is then probed, and the call reads neither the
-- lottery nor the stock), and the buyer's score in line.
local neither = redis.call('EXISTS', KEYS[9], KEYS[13], KEYS[11]) == 0
local score = neither and redis.call('ZSCORE', waiting_key, user)
-- Nor a token in the queue's token HASH (common.lua): asked only of a
-- buyer not in line, who may hold one.
if neither and not score then
  neither = redis.call('HEXISTS', tokens_key(), user) == 0
end
local total
-- A new buyer, no address limits (no places key), a line that is not empty
-- (no fast track): a new place, which is all join() would do
-- (new_place). Answered here, before the helpers below are made (a
-- closure each, per call).
if neither and not score and not places_key then
  total = redis.call('ZCARD', waiting_key)
  if total > 0 then
    local mark_key = last_mark_key()
    local v = fence_read and redis.call('MGET', pass_key, seq_key, paused_key, mark_key, KEYS[#KEYS])
      or redis.call('MGET', pass_key, seq_key, paused_key, mark_key)
    if fence_read and fence_passed(v[5], ARGV[6]) then
      return 'overtaken'
    end
    local seq = (v[2] or select(4, join_head(ARGV[5]))) + 1
    local seq_s = string.format('%d', seq)
    local entered, mark = mark_entry(seq, now, v[4])
    if mark then
      redis.call('MSET', seq_key, seq_s, mark_key, mark)
    else
      redis.call('SET', seq_key, seq_s)
    end
    redis.call('ZADD', waiting_key, seq_s, user)
    return {'waiting', 1, total, seq, '', -1, entered, total + 1, v[1] and v[1] + 0 or 0,
            v[3] and 2 or 0}
  end
end
-- A buyer in line joining again (no token: a buyer in line holds none):
-- counted against their budget (join_config's budget period, burst and
-- grace) once their entry is older than the grace, then their standing,
-- marked seen; all join() does for them.
if neither and score then
  local seq = score + 0
  local period, burst, grace = join_head(ARGV[5])
  local v = fence_read and redis.call('MGET', pass_key, paused_key, KEYS[10], KEYS[#KEYS])
    or redis.call('MGET', pass_key, paused_key, KEYS[10])
  if fence_read and fence_passed(v[4], ARGV[6]) then
    return 'overtaken'
  end
  -- A known entry ends ARGV[5] ('|entry,ms|'): its last byte tells (a
  -- pattern searching the argument cost a repeat join without one about
  -- 5,000 instructions, over a third of what reading the marks costs).
  local entered
  if ARGV[5]:byte(-1) == 124 then
    local packed = ARGV[5]
    local known, known_at = packed:match('^(%d+),(%d+)|$', packed:find('|', 1, true) + 1)
    if known == score then
      entered = known_at + 0
    end
  end
  entered = entered or entered_at(user, seq)
  if period > 0 and (not entered or now - entered >= grace) then
    local wait = gcra_stored(KEYS[10], v[3], now, period, burst)
    if wait > 0 then
      return limited('buyer', wait)
    end
  end
  total = redis.call('ZCARD', waiting_key)
  seen_now(user, now)
  return {'waiting', 0, redis.call('ZRANK', waiting_key, user), seq, '', -1, entered or -1, total,
          v[1] and v[1] + 0 or 0, v[2] and 2 or 0}
end
--@helpers
if fence_read and fence_passed(redis.call('GET', KEYS[#KEYS]), ARGV[6]) then
  return 'overtaken'
end
local g = group(now, KEYS[11], KEYS[12], KEYS[13], KEYS[14])
local c = join_config(ARGV[5])
if neither then
  group_neither(g)
end
g.total = total -- the head's ZCARD, if it read it
group_read(g, c.budget_period > 0 and KEYS[10] or nil)
local row, rank, seq, entered = join(g, KEYS[9], KEYS[10], joins_key, places_key, user, ARGV[4],
  c, neither, score)
flush(g)
return row or waiting_row(g, rank, seq, entered)
