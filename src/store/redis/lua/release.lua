-- release.lua: CLAIMED -> READY after its order rolled back.
-- KEYS (KEYS[9] the user's token key), ARGV[1..2]: see common.lua.   ARGV[3] user   ARGV[4] claim id
-- KEYS[10] the queue's audit STREAM (common.lua): a 'released' entry when 1
-- Returns 1 if the claim was released, 0 if this claim no longer holds it.
-- Atomic so a release can never undo a newer claim by another request.
local user, claim_id = ARGV[3], ARGV[4]
local key = K.token
local t = redis.call('HMGET', key, 'claim', 'entry')
if t[1] ~= claim_id then
  return 0
end
redis.call('HDEL', key, 'claim', 'claimUntil')
audit(KEYS[10], 'released', now_ms(), user, tonumber(t[2]))
return 1
