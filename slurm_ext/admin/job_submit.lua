--[[
cellsched job_submit/lua plugin (Slurm 22.05+, Lua 5.1 - 5.4).

Install: copy to job_submit.lua next to slurm.conf, set JobSubmitPlugins=lua,
then `scontrol reconfigure`. If the cellsched controller does not run as root
or as SlurmUser root, add its uid to ADMIN_UIDS below.

What it does for a MANAGED job (its Comment starts with "cellsched/v1 ",
written by `cellsched sbatch`):

  submit  * the spec JSON moves to AdminComment as {"spec": <json>} (only
            admins can write AdminComment, so the spec cannot be altered
            after submission) and the Comment becomes the bare marker
            "cellsched/v1 @AdminComment";
          * the job is held (priority 0) whether or not it asked to be;
          * a tagged Comment whose JSON is obviously malformed (not one
            {...} object of printable ASCII, or over 1011 bytes) is refused.
  modify  * a non-admin may not change a managed job's Comment,
            AdminComment, priority (hold, release), partition, features,
            node count, node lists or GPU requests: the controller owns them.
            Slurm 22.05 records a job_submit hold as a USER hold
            (Reason=JobHeldUser): this refusal is what makes it an admin
            hold in effect (the owner's `scontrol release` fails).
          * a non-admin may not turn an unmanaged job into a managed one
            (set a Comment starting with the tag).
          * admins (ADMIN_UIDS: root, the controller) may do anything.

Unmanaged jobs are untouched (except for the last modify rule).

Without this plugin `cellsched sbatch` still works: the job is submitted
with a USER hold and its spec stays in the Comment. The controller reads
the spec once, keeps the first accepted copy in its state DB and ignores
later Comment changes; but the owner can release the job early (Slurm then
runs it with the provisional GPU request, outside the controller's plan) or
change its Comment, features or node count while it is pending.
--]]

local TAG = "cellsched/v1 "
local MARKER = TAG .. "@AdminComment"
local MAX_SPEC_BYTES = 1011  -- 1024 bytes of Comment (Slurm's limit) less the tag

-- uids allowed to change managed jobs: root and the controller's user
local ADMIN_UIDS = { [0] = true }

local NO_VAL = slurm.NO_VAL or 4294967294
local NO_VAL16 = slurm.NO_VAL16 or 65534

-- string fields of job_desc a non-admin may not set on a managed job
local PROTECTED_STRINGS = {
  "comment", "admin_comment", "partition", "features", "cluster_features",
  "req_nodes", "exc_nodes", "tres_per_node", "tres_per_job", "tres_per_task",
  "tres_per_socket", "gres", "reservation",
}
-- numeric fields (unset = NO_VAL)
local PROTECTED_NUMBERS = { "priority", "min_nodes", "max_nodes", "num_tasks" }

local function starts_with(s, prefix)
  return type(s) == "string" and string.sub(s, 1, #prefix) == prefix
end

local function is_admin(uid)
  return ADMIN_UIDS[tonumber(uid)] == true
end

local function is_managed(job_rec)
  return starts_with(job_rec.comment, TAG) or starts_with(job_rec.admin_comment, '{"spec":')
end

-- the spec JSON must look like one object of printable ASCII (JSON escapes
-- everything else); the controller parses and re-validates it anyway
local function plausible_spec(json)
  return #json <= MAX_SPEC_BYTES
    and string.sub(json, 1, 1) == "{" and string.sub(json, -1) == "}"
    and not string.find(json, "[^\32-\126]")
end

-- Slurm 22.05 cannot show a message to the user from job_modify (only the
-- error code, "Access/permission denied"); the reason goes to slurmctld's log
local function refuse(msg, to_user)
  slurm.log_info("cellsched: %s", msg)
  if to_user then
    slurm.log_user("cellsched: %s", msg)
    return slurm.ERROR
  end
  return slurm.ESLURM_ACCESS_DENIED or slurm.ERROR
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  local comment = job_desc.comment
  if not starts_with(comment, TAG) then
    return slurm.SUCCESS
  end
  local json = string.sub(comment, #TAG + 1)
  if not plausible_spec(json) then
    return refuse("malformed cellsched spec in the job comment; submit with `cellsched sbatch`", true)
  end
  job_desc.admin_comment = '{"spec":' .. json .. '}'
  job_desc.comment = MARKER
  job_desc.priority = 0
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  if is_admin(modify_uid) then
    return slurm.SUCCESS
  end
  if not is_managed(job_rec) then
    if starts_with(job_desc.comment, TAG) then
      return refuse(string.format("job %s: only cellsched sbatch makes a job managed", tostring(job_rec.job_id)))
    end
    return slurm.SUCCESS
  end
  for _, name in ipairs(PROTECTED_STRINGS) do
    if job_desc[name] ~= nil then
      return refuse(string.format("job %s is scheduled by cellsched: %s cannot be changed by users",
                                  tostring(job_rec.job_id), name))
    end
  end
  for _, name in ipairs(PROTECTED_NUMBERS) do
    local v = job_desc[name]
    if v ~= nil and v ~= NO_VAL and v ~= NO_VAL16 then
      return refuse(string.format("job %s is scheduled by cellsched: %s cannot be changed by users (holds and releases are the controller's)",
                                  tostring(job_rec.job_id), name))
    end
  end
  return slurm.SUCCESS
end

slurm.log_info("cellsched job_submit.lua loaded (%s)", _VERSION)
return slurm.SUCCESS
