-- release.lua: CLAIMED -> READY after its order rolled back.
-- KEYS (KEYS[9] the user's token key of the earlier layout: common.lua), ARGV[1..2]: see common.lua.   ARGV[3] user   ARGV[4] claim id
-- KEYS[10] the queue's audit STREAM (common.lua): a 'released' entry when 1
-- Returns 1 if the claim was released, 0 if this claim no longer holds it.
-- Atomic so a release can never undo a newer claim by another request.
local user, claim_id = ARGV[3], ARGV[4]
local t = token_get(user, K.token)
if not t or t.claim ~= claim_id then
  return 0
end
t.claim, t.claim_until = nil, nil
token_put(user, t)
audit(KEYS[10], 'released', now_ms(), user, t.entry)
return 1
