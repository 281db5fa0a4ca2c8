-- enter_many.lua: a group of joins in one call (group commit), each with
-- its own outcome, in the order given: the order the instance received
-- them, so the line keeps strict FIFO within the group and across groups
-- (an instance sends a queue's next group only after this one answered).
-- KEYS[1..8], ARGV[1..2]: see common.lua. All in the queue's hash tag. With
-- n joins:
-- KEYS[9..8+n]  the joining users' token keys, join i at KEYS[8+i]
-- KEYS[9+n..]   three per join, join i at KEYS[9+n+3(i-1) ..]: the user's
--               request budget, the client address's join rate and places
--               (as enter.lua's KEYS[10..12])
-- KEYS[#KEYS-1] the queue's stock HASH (see common.lua)
-- KEYS[#KEYS]   the queue's audit STREAM (common.lua): fast-track admissions
-- ARGV[3..]     13 per join, join i at ARGV[3+13(i-1) ..], as join.lua lists
-- Returns one join() row per join, in order: describe(), or limited(...)
-- for a join refused by a limit (that join changed nothing; the others
-- still count). The same user twice in a group takes one place: the second
-- join sees the first and gets the repeat answer; two joins from one
-- address count twice against its limits, as two calls would.
-- Atomic for the reasons join.lua gives, and so one group is one step: no
-- other call runs between its joins, so they keep the order they were sent.
local n = (#ARGV - 2) / 13
local now = now_ms()
expire_active(now)
local g = group(now, KEYS[#KEYS - 1], KEYS[#KEYS])
local out = {}
for i = 1, n do
  local k = 9 + n + 3 * (i - 1)
  local a = 3 + 13 * (i - 1)
  out[i] = join(g, {KEYS[8 + i], KEYS[k], KEYS[k + 1], KEYS[k + 2]}, {unpack(ARGV, a, a + 12)})
end
flush(g)
return out
