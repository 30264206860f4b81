"""Pure parsers from Slurm command output (JSON or text) to slurm_ext.records.

- ``json_output``: ``squeue --json``, ``sinfo --json``, slurmrestd and the
  newer data_parser schemas (``scontrol show ... --json``).
- ``scontrol_text``: ``scontrol [-d] show [-o] job|node|partition``.
- ``values``: the small decoders both share (NO_VAL numbers, states, GRES,
  exit codes, times).
"""

from slurm_ext.parse.values import ParseError

__all__ = ["ParseError"]
