-- wrk script for tests/interop/test_wrk.py: every request is the same (method, body and
-- content type from the arguments), and every reply must be status 200 with exactly the
-- expected body. Each thread counts its replies; done() prints the totals on one line that the
-- test reads, with the first wrong reply seen, and exits 1 when any reply was wrong.
--
--   wrk ... -s check_reply.lua URL -- METHOD REQUEST_BODY_FILE EXPECTED_BODY_FILE

local threads = {}

local function read_file(path)
  if path == nil or path == "-" then
    return nil
  end
  local f = assert(io.open(path, "rb"))
  local data = f:read("*a")
  f:close()
  return data
end

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  checked, wrong, first_wrong = 0, 0, ""
  expected = assert(read_file(args[3]), "no expected body")
  wrk.method = args[1]
  local body = read_file(args[2])
  if body ~= nil then
    wrk.body = body
    wrk.headers["Content-Type"] = "application/json"
  end
end

function response(status, headers, body)
  checked = checked + 1
  if status ~= 200 or body ~= expected then
    wrong = wrong + 1
    if first_wrong == "" then
      first_wrong = string.format("status %d body %q", status, string.sub(body or "", 1, 300))
    end
  end
end

function done(summary, latency, requests)
  local total_checked, total_wrong, example = 0, 0, ""
  for _, thread in ipairs(threads) do
    total_checked = total_checked + thread:get("checked")
    total_wrong = total_wrong + thread:get("wrong")
    if example == "" then
      example = thread:get("first_wrong")
    end
  end
  io.write(string.format("interop-check: checked=%d wrong=%d errors=%d\n", total_checked, total_wrong,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.status
      + summary.errors.timeout))
  if total_wrong > 0 then
    io.write("interop-first-wrong: " .. example .. "\n")
    os.exit(1)
  end
end
