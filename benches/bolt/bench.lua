-- A CPU-bound Lua workload for scripts/bolt_bench.sh: recursion, table sorts with and
-- without a comparator, string.format/gsub/gmatch, metatable-based objects. The argument
-- scales it (1: a short run for tracing; the bench's default runs about 1.5 s natively).
local scale = tonumber(arg[1]) or 1

local function fib(n) if n < 2 then return n end return fib(n - 1) + fib(n - 2) end

local Vec = {}
Vec.__index = Vec
function Vec.new(x, y) return setmetatable({x = x, y = y}, Vec) end
function Vec.__add(a, b) return Vec.new(a.x + b.x, a.y + b.y) end
function Vec:len2() return self.x * self.x + self.y * self.y end

local checksum = 0
for round = 1, scale do
  checksum = checksum + fib(20)

  local t = {}
  local seed = round
  for i = 1, 20000 do
    seed = (seed * 1103515245 + 12345) % 2147483648
    t[i] = seed % 100000
  end
  table.sort(t)
  checksum = checksum + t[1] + t[#t]
  table.sort(t, function(a, b) return a > b end)
  checksum = checksum + t[1]

  local parts = {}
  for i = 1, 3000 do parts[#parts + 1] = string.format("%d:%05.2f;", i, i / 7) end
  local s = table.concat(parts)
  local replaced, n = s:gsub("(%d+):", "%1=")
  checksum = checksum + n
  for k, v in replaced:gmatch("(%d+)=([%d%.]+);") do checksum = checksum + #k + #v end

  local acc = Vec.new(0, 0)
  for i = 1, 20000 do acc = acc + Vec.new(i % 7, i % 11) end
  checksum = checksum + acc:len2() % 1000
end
print(checksum)
