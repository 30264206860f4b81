"""`cellsched sbatch`: parse, validate and submit a managed job.

Settings come from three places, the first that has a setting wins:

1. the command line: ``cellsched sbatch [options] [--] SCRIPT [ARGS...]``;
   option parsing stops at the script, whose arguments pass through as is;
2. ``#CELLSCHED key=value`` lines of the script (key = a long option name
   without the dashes, e.g. ``#CELLSCHED global-batch=512``);
3. ``#SBATCH`` lines of the script, for the pass-through options.

Directive lines are read, like sbatch reads ``#SBATCH``, from the script's
leading block of comments and blank lines; a directive after the first
command is refused. ``#SBATCH`` lines and ``SBATCH_*`` variables that would
set what the scheduler decides (GPUs, nodes, constraints, holds, comment)
are refused too, so nothing reaches Slurm behind the wrapper's back.

Everything is checked before Slurm sees anything (`prepare`): an error is a
`WrapperError` naming the field, and the CLI prints it as one line
``cellsched sbatch: error: <field>: <message>`` and exits with status 2.

Modules, in the order a submission meets them:

- `options`: the option table, the sbatch options refused and why, `Setting`, `WrapperError`, the usage text;
- `argv`: the command line (and the tokens of an #SBATCH line) into settings;
- `directives`: #CELLSCHED and #SBATCH lines of the script's leading block;
- `environment`: SBATCH_* variables that would bypass the wrapper;
- `script`: reading the batch script;
- `values`: typed values of settings (numbers, name lists, one-line text);
- `model`: --model, a preset or a spec file;
- `launched`: the commands the script runs under cellsched-launch, as written;
- `frameworks`: the model a megatron or torchtitan job's command trains (derived when --model is not
  given, else checked against it);
- `spec`: the JobSpec of the merged settings;
- `feasibility`: whether the job can ever run on the cluster;
- `submission`: `prepare`, the held sbatch request (`Submission`, `provisional_gres`);
- `command`: `main`, the `cellsched sbatch` entry point.
"""
