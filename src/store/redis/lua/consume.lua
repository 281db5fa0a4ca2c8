-- consume.lua: deletes a claimed token after its order committed.
-- KEYS (KEYS[9] the user's token key of the earlier layout: common.lua), ARGV[1..2]: see common.lua.   ARGV[3] user   ARGV[4] claim id
-- KEYS[10] the queue's stock HASH (see common.lua): a used token is counted
-- there until the order service's next report (which may not show its order)
-- KEYS[11] the queue's audit STREAM (common.lua): a 'consumed' entry when 1
-- Returns 1 if the token was deleted, 0 if this claim no longer holds it
-- (gone, or claimed anew); publishes {"kind":"consumed","user":..} when 1.
-- The lease is not checked: a lapsed claim still deletes its token while no
-- newer claim took it, so a consume retried after a restart finishes.
-- Idempotent: a repeat returns 0.
-- Atomic so the token and the user's active slot go together (the slot is
-- what lets admission admit the next person) and only the claim holder can
-- delete it.
local user, claim_id = ARGV[3], ARGV[4]
local t = token_get(user, K.token)
if not t or t.claim ~= claim_id then
  return 0
end
token_del(user, t)
redis.call('ZREM', K.active, user)
if redis.call('EXISTS', KEYS[10]) == 1 then
  redis.call('HINCRBY', KEYS[10], 'consumed', 1)
end
publish(cjson.encode({kind = 'consumed', user = user}))
audit(KEYS[11], 'consumed', now_ms(), user, t.entry)
return 1
