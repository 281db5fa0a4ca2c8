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
local g = group(now, KEYS[13], KEYS[14], KEYS[15], KEYS[16])
local user = ARGV[3]
local c = join_config(ARGV, 5)
-- The common case in two reads: no token, no lottery, no stock (one
-- EXISTS: join's repeat check is then probed, and the call reads neither
-- the lottery nor the stock), and the queue's STRINGs with the buyer's
-- budget (one MGET, group_read).
local probed, score = false, nil
if redis.call('EXISTS', KEYS[9], KEYS[15], KEYS[13]) == 0 then
  group_neither(g)
  probed, score = true, redis.call('ZSCORE', K.waiting, user)
end
group_read(g, c.budget_period > 0 and KEYS[10] or nil)
local row, rank, seq, entered = join(g, KEYS[9], KEYS[10], KEYS[11], KEYS[12], user, ARGV[4],
  c, probed, score)
flush(g)
return row or waiting_row(g, rank, seq, entered)
