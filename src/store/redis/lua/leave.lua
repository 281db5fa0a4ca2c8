-- leave.lua: gives up one entry: takes the user out of line, or drops the
-- token that entry was admitted with.
-- KEYS (KEYS[9] the user's token key of the earlier layout: common.lua), ARGV[1..2]: see common.lua.   ARGV[3] user   ARGV[4] entry id
-- KEYS[10] the queue's audit STREAM (common.lua): a 'left' entry when 1
-- Returns 1 if the user's current entry is ARGV[4] and it was given up, else
-- 0 (no entry, or a newer one: nothing changes); publishes
-- {"kind":"left","user":..,"seq":..} on the queue's channel when 1.
-- Atomic so the entry check and the removal are one step (a ticket for an
-- old entry can never remove a newer place, however the calls interleave),
-- the line, its indexes, the token and the active set change together, and
-- the event is published exactly when something changed.
local user, entry = ARGV[3], tonumber(ARGV[4])
if not entry then
  return 0
end
-- The line first: a buyer in line holds no token, and most who leave
-- wait.
local seq
local t
local score = redis.call('ZSCORE', K.waiting, user)
if score and score + 0 == entry then
  seq = entry
  drop_from_line(user)
else
  t = token_get(user, K.token)
  if not t or t.entry ~= entry then
    return 0
  end
  token_del(user, t)
  redis.call('ZREM', K.active, user)
end
publish(cjson.encode({kind = 'left', user = user, seq = seq}))
audit(KEYS[10], 'left', now_ms(), user, entry)
return 1
