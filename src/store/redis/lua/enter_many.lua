-- enter_many.lua: a group of joins in one call (group commit), each with
-- its own outcome, in the order given: the order the instance received
-- them, so the line keeps strict FIFO within the group and across groups
-- (an instance sends a queue's next group only after this one answered).
-- KEYS[1..8], ARGV[1..2]: see common.lua. All in the queue's hash tag.
-- ARGV[3..13]   the 11 arguments every join of the group shares (the
--               queue's policy and the limits' numbers), as join.lua's
--               join_config lists them: sent and parsed once per call
-- ARGV[14..]    two per join, join i at ARGV[14+2(i-1)], ARGV[15+2(i-1)]:
--               the user, the fast-track token
-- KEYS[9..]     m per join, join i at KEYS[9+m(i-1) ..]: the user's token
--               key and request budget, then, only when the address has
--               limits (address join period or places per address above
--               zero: m = 4, else m = 2), the client address's join rate
--               and places (as enter.lua's KEYS[9..12])
-- KEYS[#KEYS-3] the queue's stock HASH (see common.lua)
-- KEYS[#KEYS-2] the queue's audit STREAM (common.lua): fast-track admissions
-- KEYS[#KEYS-1] the lottery HASH, KEYS[#KEYS] the pre-queue HASH (see
--               lottery_schedule.lua): a join answers 'prequeue' before a
--               draw; the lottery's state is read once per call
-- Returns one join() row per join, in order: describe(), or limited(...)
-- for a join refused by a limit (that join changed nothing; the others
-- still count). The same user twice in a group takes one place: the second
-- join sees the first and gets the repeat answer; two joins from one
-- address count twice against its limits, as two calls would.
-- Atomic for the reasons join.lua gives, and so one group is one step: no
-- other call runs between its joins, so they keep the order they were sent.
local c = join_config(ARGV, 3)
local n = (#ARGV - 13) / 2
local m = (c.join_period > 0 or c.max_places > 0) and 4 or 2
local now = now_ms()
expire_active(now)
local g = group(now, KEYS[#KEYS - 3], KEYS[#KEYS - 2], KEYS[#KEYS - 1], KEYS[#KEYS])
local out = {}
for i = 1, n do
  local k = 9 + m * (i - 1)
  local a = 14 + 2 * (i - 1)
  local joins_key, places_key
  if m == 4 then
    joins_key, places_key = KEYS[k + 2], KEYS[k + 3]
  end
  out[i] = join(g, KEYS[k], KEYS[k + 1], joins_key, places_key, ARGV[a], ARGV[a + 1], c)
end
flush(g)
return out
