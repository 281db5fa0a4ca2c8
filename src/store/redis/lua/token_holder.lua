-- token_holder.lua: whose live token the presented one is, for the token
-- API's claim by the token alone (the order service may not know the
-- buyer: a visitor cookie it cannot read).
-- KEYS[1..8], ARGV[1..2]: see common.lua (no KEYS[9]: the user is what is
-- looked up). ARGV[3] presented token.
-- Returns the user, or false. Read-only: the claim that follows checks the
-- token again, atomically, under its own script.
local presented = ARGV[3]
local user = redis.call('HGET', tokens_key(), index_field(presented))
  or redis.call('GET', old_index(presented))
if not user then
  return false
end
local t = token_get(user)
if not t or t.token ~= presented or t.exp <= now_ms() then
  return false
end
return user
