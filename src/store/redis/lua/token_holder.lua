-- token_holder.lua: whose live token the presented one is, for the token
-- API's claim by the token alone (the order service may not know the
-- buyer: a visitor cookie it cannot read).
-- KEYS[1..8], ARGV[1..2]: see common.lua (no KEYS[9]: the user is what is
-- looked up). ARGV[3] presented token.
-- Returns the user, or false. Read-only: the claim that follows checks the
-- token again, atomically, under its own script.
local presented = ARGV[3]
local user = redis.call('GET', token_index(presented))
if not user then
  return false
end
local t = redis.call('HMGET', K.tokprefix .. user, 'token', 'exp')
-- An index entry outlives a token used up or replaced: it names the user
-- only while their token is still this one.
if t[1] ~= presented or not t[2] or tonumber(t[2]) <= now_ms() then
  return false
end
return user
