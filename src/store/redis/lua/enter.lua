-- enter.lua: put a user in line, or keep the place or token they have,
-- checked against the buyer's and the client address's limits (see
-- join.lua, which does the work).
-- KEYS[1..8], ARGV[1..2]: see common.lua. All in the queue's hash tag:
-- KEYS[9]  the user's token key
-- KEYS[10] the user's request budget (STRING, see gcra.lua)
-- KEYS[11] the client address's join rate (STRING, see gcra.lua)
-- KEYS[12] the client address's places: ZSET user -> entry id
-- KEYS[13] the queue's stock HASH (see common.lua): no fast track past it
-- KEYS[14] the queue's audit STREAM (common.lua): fast-track admissions
-- KEYS[15] the lottery HASH, KEYS[16] the pre-queue HASH (see
--          lottery_schedule.lua): a join answers 'prequeue' before a draw
-- ARGV[3..4]  the user and the fast-track token
-- ARGV[5..15] the join's 11 further arguments, as join.lua's join_config lists them
-- Returns join()'s row: describe(), or limited(...) changing nothing.
-- Atomic for the reasons join.lua gives.
local now = now_ms()
local user = ARGV[3]
-- The common case in two reads: no token, no lottery, no stock (one
-- EXISTS: join's repeat check is then probed, and the call reads neither
-- the lottery nor the stock), and the buyer's score in line.
local neither = redis.call('EXISTS', KEYS[9], KEYS[15], KEYS[13]) == 0
local score = neither and redis.call('ZSCORE', K.waiting, user)
local total
-- A new buyer, no address limits (ARGV[13], ARGV[15]: join_config's
-- join period and places), a line that is not empty (no fast track): a
-- new place, which is all join() would do (new_place). Answered here,
-- before the helpers below are made (a closure each, per call).
if neither and not score and tonumber(ARGV[13]) == 0 and tonumber(ARGV[15]) == 0 then
  total = redis.call('ZCARD', K.waiting)
  if total > 0 then
    local mark_key = last_mark_key()
    local v = redis.call('MGET', K.pass, K.seq, K.paused, mark_key)
    local seq = tonumber(v[2] or ARGV[9]) + 1
    local entered, mark = mark_entry(seq, now, v[4])
    if mark then
      redis.call('MSET', K.seq, string.format('%d', seq), mark_key, mark)
    else
      redis.call('SET', K.seq, string.format('%d', seq))
    end
    redis.call('ZADD', K.waiting, string.format('%d', seq), user)
    return {'waiting', 1, total, seq, '', -1, entered, total + 1, tonumber(v[1] or '0'),
            v[3] and 2 or 0}
  end
end
-- A buyer in line joining again (no token: a buyer in line holds none):
-- counted against their budget (ARGV[10..12]: join_config's budget
-- period, burst and grace) once their entry is older than the grace,
-- then their standing, marked seen; all join() does for them.
if neither and score then
  local seq, period = tonumber(score), tonumber(ARGV[10])
  local v = redis.call('MGET', K.pass, K.paused, KEYS[10])
  local entered = entered_at(user, seq)
  if period > 0 and (not entered or now - entered >= tonumber(ARGV[12])) then
    local wait = gcra_stored(KEYS[10], v[3], now, period, tonumber(ARGV[11]))
    if wait > 0 then
      return limited('buyer', wait)
    end
  end
  total = redis.call('ZCARD', K.waiting)
  seen_now(user, now)
  return {'waiting', 0, redis.call('ZRANK', K.waiting, user), seq, '', -1, entered or -1, total,
          tonumber(v[1] or '0'), v[2] and 2 or 0}
end
--@helpers
local g = group(now, KEYS[13], KEYS[14], KEYS[15], KEYS[16])
local c = join_config(ARGV, 5)
if neither then
  group_neither(g)
end
g.total = total -- the head's ZCARD, if it read it
group_read(g, c.budget_period > 0 and KEYS[10] or nil)
local row, rank, seq, entered = join(g, KEYS[9], KEYS[10], KEYS[11], KEYS[12], user, ARGV[4],
  c, neither, score)
flush(g)
return row or waiting_row(g, rank, seq, entered)
