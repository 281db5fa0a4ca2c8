-- leave.lua: takes a user out of line and drops their token.
-- KEYS, ARGV[1..2]: see common.lua.   ARGV[3] user
-- Returns 1 if the user waited or held a token, else 0; publishes
-- {"kind":"left","user":..,"seq":..} on the queue's channel when 1.
-- Atomic so the line, its indexes, the token and the active set change
-- together, and the event is published exactly when something changed.
local user = ARGV[3]
local had_token = redis.call('DEL', K.tokprefix .. user)
redis.call('ZREM', K.active, user)
local seq = unline(user)
if had_token == 1 or seq then
  redis.call('PUBLISH', K.channel, cjson.encode({kind = 'left', user = user, seq = seq}))
  return 1
end
return 0
