"""The JobSpec of merged settings, checked on its own (the cluster comes later)."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence

from slurm_ext.wrapper.frameworks import JobModel, job_model
from slurm_ext.wrapper.launched import Word
from slurm_ext.wrapper.model import definition_of, load_model
from slurm_ext.wrapper.options import Setting, WrapperError
from slurm_ext.wrapper.values import NAME, field_name, name_list, one_line, whole_number
from solver.contract.jobspec import GPU_TYPE, JobSpec, JobSpecError
from solver.contract.runtimes import DEFAULT_RUNTIME, SUBMITTABLE, UnknownRuntime, get_runtime

#: JobSpecError field -> the option that sets it
_SPEC_TO_OPTION = {
    "global_batch": "global-batch",
    "gpu_types": "gpu-types",
    "min_gpus": "min-gpus",
    "max_gpus": "max-gpus",
    "requested_gpus": "gpus",
    "requested_gpu_type": "gpu-type",
    "virtual_workers": "virtual-workers",
    "model_def": "model",
    "partitions": "partition",
}


def runtime_of(setting: Setting | None) -> str:
    """The runtime a submission names (DEFAULT_RUNTIME when none); only
    the submittable ones (solver.contract.runtimes.SUBMITTABLE)."""
    if setting is None:
        return DEFAULT_RUNTIME
    name = str(setting.value).strip()
    try:
        submittable = get_runtime(name).submittable
        why = "is the simulator's runtime for trace jobs"
    except UnknownRuntime:
        submittable, why = False, "is not a runtime"
    if not submittable:
        raise WrapperError(field_name("runtime", setting), f"{name!r} {why}; known: {', '.join(SUBMITTABLE)}")
    return name


def model_of(setting: Setting | None, cwd: pathlib.Path, stated: JobModel | None) -> tuple[str, dict | None]:
    """(the spec's model name, its inline definition or None): --model, which
    must agree with what the job's command states of its model; without
    --model, the model the command states."""
    if setting is None:
        assert stated is not None
        spec = stated.spec()
        return spec.name, definition_of(spec)
    model, model_def, spec = load_model(setting, cwd)
    problems = stated.contradictions(spec) if stated is not None else []
    if problems:
        raise WrapperError(field_name("model", setting), "; ".join(problems))
    return model, model_def


def build_spec(settings: Mapping[str, Setting], cwd: pathlib.Path, commands: Sequence[Sequence[Word]] = ()) -> JobSpec:
    """The JobSpec from merged settings (no cluster checks yet). `commands`:
    what the script runs under cellsched-launch (launched.launched_commands),
    where a framework runtime's command states its model (frameworks.job_model)."""
    get = settings.get
    runtime = runtime_of(get("runtime"))
    stated = job_model(runtime, commands)
    for required in ("model", "global-batch", "iterations"):
        if required not in settings and not (required == "model" and stated is not None):
            raise WrapperError(required, f"is required (--{required} or '#CELLSCHED {required}=...')")
    model, model_def = model_of(settings.get("model"), cwd, stated)
    global_batch = whole_number("global-batch", settings["global-batch"], 1, 10**9)
    iterations = whole_number("iterations", settings["iterations"], 1, 10**12)
    min_gpus = whole_number("min-gpus", get("min-gpus"), 1, 100_000)
    max_gpus = whole_number("max-gpus", get("max-gpus"), 1, 100_000)
    gpus = whole_number("gpus", get("gpus"), 1, 100_000)
    workers = whole_number("virtual-workers", get("virtual-workers"), 1, 100_000)
    if min_gpus is not None and max_gpus is not None and min_gpus > max_gpus:
        raise WrapperError(
            field_name("min-gpus", settings["min-gpus"]), f"{min_gpus} is more than max-gpus ({max_gpus})"
        )
    if gpus is not None:
        if min_gpus is not None and gpus < min_gpus:
            raise WrapperError(field_name("gpus", settings["gpus"]), f"{gpus} is less than min-gpus ({min_gpus})")
        if max_gpus is not None and gpus > max_gpus:
            raise WrapperError(field_name("gpus", settings["gpus"]), f"{gpus} is more than max-gpus ({max_gpus})")
    if workers is not None and global_batch is not None and global_batch % workers:
        raise WrapperError(
            field_name("virtual-workers", settings["virtual-workers"]),
            f"{workers} does not divide global-batch ({global_batch})",
        )
    gpu_types = (
        name_list("gpu-types", settings["gpu-types"], GPU_TYPE, "GPU type name") if "gpu-types" in settings else None
    )
    gpu_type = one_line("gpu-type", get("gpu-type"), GPU_TYPE, "a GPU type name")
    if gpu_type is not None and gpu_types is not None and gpu_type not in gpu_types:
        raise WrapperError(
            field_name("gpu-type", settings["gpu-type"]), f"{gpu_type!r} is not among gpu-types ({','.join(gpu_types)})"
        )
    partitions = (
        name_list("partition", settings["partition"], NAME, "partition name") if "partition" in settings else None
    )
    elastic = get("elastic")
    try:
        spec = JobSpec(
            model=model,
            global_batch=global_batch,
            iterations=iterations,
            model_def=model_def,
            gpu_types=gpu_types,
            min_gpus=min_gpus or 1,
            max_gpus=max_gpus,
            elastic=bool(elastic.value) if elastic else False,
            requested_gpus=gpus,
            requested_gpu_type=gpu_type,
            virtual_workers=workers,
            partitions=partitions,
            runtime=runtime,
        )
        spec.to_json()  # the size limit
        return spec
    except JobSpecError as exc:
        name = _SPEC_TO_OPTION.get(exc.field, exc.field)
        raise WrapperError(
            field_name(name, settings[name]) if name in settings else name, str(exc).removeprefix(f"{exc.field}: ")
        ) from None
