"""What the differential accepts: agreement on the verdict, and on the cause.

- A false accept (validation passes, Triton refuses) fails unless it is in `ALLOWED_FALSE_ACCEPTS`,
  and an entry there excuses only the refusal it names: the host capability, the text of Triton's
  refusal, and the refusal of the deploy-time host check (controlplane/triton/capabilities.py) that
  stops it before Triton for a launched server. A case refused for another reason fails.
- A false accept of a model whose `auto_complete_config` fails only at load, for the config it is given
  (`MODEL_DECIDES`), is excused only when validation warned that the load completes its config and
  Triton's refusal comes from that method: what the model's code decides, no offline check can.
- A false refusal (validation refuses, Triton loads) must be a documented stricter rule (`STRICTER`,
  docs/validation.md says why).
- The deploy-time host check must never refuse what Triton loads.
- When both refuse, both must name the same field: `triton_fields` reads the fields out of Triton's
  reason with `TRITON_WORDS` (Triton's own phrases, measured on 2.51, each with the config field it
  is about) and compares them with the fields of validation's problems. A reason that names another
  field, or that no phrase explains, is a mismatch: it fails unless listed in `REASON_DIFFERS`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from controlplane.validation.modelconfig import Problem
from tests.differential.casekit import Case
from tests.differential.cases import all_cases
from tests.differential.runner import Outcome


@dataclass(frozen=True)
class Excuse:
    capability: str  # what the serving host must offer
    triton: str  # regex: the refusal of Triton this excuses
    deploy: str  # regex: the deploy-time host check's refusal, for a server tritonctl launched


_NO_GPU = r"has kind KIND_GPU but no GPUs are available"
_DEPLOY_NO_GPU = r"^instance_group\[0\] needs a GPU \(KIND_GPU\); the tritonserver at \S+ has 0 GPUs$"

# Validation passes, Triton refuses: what only the serving host decides. Each is refused before the
# load by the deploy-time host check of a launched server (asserted case by case).
ALLOWED_FALSE_ACCEPTS = {
    "instances_gpu": Excuse("a GPU (instance_group KIND_GPU)", _NO_GPU, _DEPLOY_NO_GPU),
    "ens_step_gpu_member": Excuse("a GPU for a step model (its instance_group KIND_GPU)",
                                  r"'ens_step_gpu_member_a' .*" + _NO_GPU, _DEPLOY_NO_GPU),
    "platform_mismatch": Excuse("the onnxruntime backend installed in the tritonserver",
                                r"unable to find backend library for backend 'onnxruntime'",
                                r"^backend 'onnxruntime' is not installed in this tritonserver"),
    "env_missing_abs": Excuse("the file /nonexistent/env.tar.gz on the tritonserver's host (an absolute "
                              "EXECUTION_ENV_PATH)",
                              r"Failed to get the canonical path for /nonexistent/env\.tar\.gz",
                              r'^config\.pbtxt: parameters\["EXECUTION_ENV_PATH"\]: "/nonexistent/env\.tar\.gz" '
                              r"does not exist on the host of the tritonserver"),
}

# Validation refuses, Triton loads: the deliberate stricter rules (docs/validation.md says why).
STRICTER = {
    "dims_duplicate_input": "two inputs of one name: Triton loads it; a request cannot address both",
    "dims_duplicate_output": "two outputs of one name: Triton loads it; a response cannot carry both",
    "instances_count_zero": "instance count 0: Triton silently runs 1 instance",
    "instances_count_negative": "instance count < 0: Triton silently runs 1 instance",
    "dyn_no_batching": "dynamic_batching with max_batch_size 0: Triton loads it and never batches",
    "parameters_bake_bad": "a bad tritonctl.bake_s: Triton ignores tritonctl's parameters; the model would bake on "
                           "the daemon's limits",
    "ac_no_config_no_method": "no config.pbtxt and no auto_complete_config: Triton loads it with no inputs and no "
                              "outputs; every request with a tensor fails",
    "ac_partial_no_io_no_method": "no inputs, no outputs and no auto_complete_config to add them: as above",
}

# Validation passes with its warning that the load completes the config, Triton refuses: the model's
# auto_complete_config fails for the config it is given at load, which only running it shows.
MODEL_DECIDES = {
    "ac_raises_at_load": "raises when the config it is given declares no input",
}
_MODEL_CODE = r"\(\d+\): auto_complete_config\b|auto_complete_config function in model"

# Both refuse, for reasons that name different fields, and why that is right. Empty: none today.
REASON_DIFFERS: dict[str, str] = {}

PARSE = "<parse>"  # validation's field for a parse error is `line:col`
# Triton's phrases (tritonserver 2.51, from the gRPC answer and the server log) and the config
# field each is about, as validation names fields (indices and map keys left out). \1 is a group.
TRITON_WORDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (r"failed to read text proto from", (PARSE,)),
    (r"unexpected directory name .* directory name must equal model name", ("name",)),
    (r"'max_batch_size' must be non-negative", ("max_batch_size",)),
    (r"model (input|output) '[^']*' (dimension must be|must specify 'dims')", (r"\1.dims",)),
    (r"model (input|output) '[^']*' must specify 'data_type'", (r"\1.data_type",)),
    (r"model (input|output) must specify 'name'", (r"\1.name",)),
    (r"model (input|output) '[^']*' (has different size for dims and reshape|cannot have empty reshape"
     r"|reshape dimensions must be)", (r"\1.reshape",)),
    (r"at least one version must be available under the version policy", ("version_policy", "versions")),
    (r"version \d+ is specified for model '[^']*', but the version directory is not present",
     ("version_policy.specific.versions",)),
    (r"unable to find backend library for backend", ("backend",)),
    (r"instance group \S+ of model \S+ has kind KIND_CPU but specifies one or more GPUs", ("instance_group.gpus",)),
    (_NO_GPU, ("instance_group.kind",)),
    (r"instance group should not be specified for ensemble", ("instance_group",)),
    (r"dynamic batching preferred size must be", ("dynamic_batching.preferred_batch_size",)),
    (r"default priority level must be in range", ("dynamic_batching.default_priority_level",)),
    (r"priority queue policy must have priority level in range", ("dynamic_batching.priority_queue_policy",)),
    (r"sequence batching preferred batch size must be", ("sequence_batching.oldest.preferred_batch_size",)),
    (r"sequence batching (must specify either|specifies more than one from|control '\w+' must have exactly"
     r"|must not specify either)", ("sequence_batching.control_input.control",)),
    (r"unexpected data type for control CONTROL_SEQUENCE_CORRID",
     ("sequence_batching.control_input.control.data_type",)),
    (r"sequence batching specifies multiple CONTROL_\w+ tensors", ("sequence_batching.control_input.control.kind",)),
    (r"sequence batching control tensor must have a name", ("sequence_batching.control_input.name",)),
    (r"unknown source input name|batch input kind '\w+' expects \d+ source input", ("batch_input.source_input",)),
    (r"batch input data type must be", ("batch_input.data_type",)),
    # the same refusal with auto-complete on (the completion's normalization words it so; measured on 2.51)
    (r"unexpected batch input data type", ("batch_input.data_type",)),
    (r"failed to open text file for read \S*/warmup/|warmup setting expects \d+ bytes",
     ("model_warmup.inputs.input_data_file",)),
    (r"inference input '[^']*' data-type is '\w+', but model", ("model_warmup.inputs.data_type",)),
    (r"unexpected shape for input '[^']*'|warmup setting expects all variable-size dimensions",
     ("model_warmup.inputs.dims",)),
    (r"expected \d+ inputs but got \d+ inputs|warmup setting expects input '[^']*' to have input_data_type set",
     ("model_warmup.inputs",)),
    (r"failed to run warmup sample '[^']*': batch size \d+", ("model_warmup.batch_size",)),
    (r"failed to open text file for read (?!\S*/warmup/)", ("output.label_filename",)),
    (r"Failed to get the canonical path for", ("parameters",)),
    (r"ensemble tensor \S+ is mapping to non-existing input|must specify 'input_map' in step"
     r"|input \S+ in model \S+ is not mapped to any ensemble tensors|is not written: at least one of its "
     r"depending tensors", ("ensemble_scheduling.step.input_map",)),
    (r"ensemble tensor \S+ is mapped from non-existing output|can appear in an output map only once"
     r"|ensemble tensor '[^']*' is unused in ensemble", ("ensemble_scheduling.step.output_map",)),
    (r"ensemble tensor \S+: inconsistent (data type|shape)", ("ensemble_scheduling.step",)),
    (r"contains models that are not available or ambiguous|circular dependency between ensembles"
     r"|depends on '[^']*' which (is not valid|has no loaded version)", ("ensemble_scheduling.step.model_name",)),
    (r"depends on '[^']*' whose required version \d+ is not loaded", ("ensemble_scheduling.step.model_version",)),
    (r"allows maximum batch size \d+, but it contains model", ("max_batch_size",)),
    (r"ensemble (input|output) '[^']*' for ensemble \S+ is not used", (r"\1",)),
    (r"ensemble scheduling must be set for ensemble", ("ensemble_scheduling",)),
    # a python model's auto_complete_config at load (pb_utils.ModelConfig's checks, the stub's): measured on 2.51
    (r"tensor '[^']*': the model expects dims \S+ but the model configuration specifies dims", ("input.dims",
                                                                                              "output.dims")),
    (r"configuration expects datatype \w+ for (input|output) '", (r"\1.data_type",)),
    (r"configuration specified max_batch_size \d+, but in auto-complete-config function", ("max_batch_size",)),
    (_MODEL_CODE, ("auto_complete_config",)),
    # the stub's completed config did not parse (an add_input with a data_type Triton does not know)
    (r"model configuration is not provided for model", ("auto_complete_config",)),
)
_WORDS = tuple((re.compile(pattern), fields) for pattern, fields in TRITON_WORDS)


def triton_fields(reason: str) -> set[str]:
    """The config fields Triton's reason names (empty: no phrase in `TRITON_WORDS` explains it)."""
    found: set[str] = set()
    for pattern, fields in _WORDS:
        for match in pattern.finditer(reason):
            found.update(match.expand(field) for field in fields)
    return found


def validator_field(problem: Problem) -> str:
    """A problem's field without indices and map keys: `model_warmup[0].inputs["x"].dims` is
    `model_warmup.inputs.dims`; a parse error's `line:col` is PARSE."""
    if re.fullmatch(r"\d+:\d+", problem.field):
        return PARSE
    return re.sub(r"\[[^\]]*\]", "", problem.field)


def _related(a: str, b: str) -> bool:
    """The same field, or one inside the other (`ensemble_scheduling.step` names its input_map)."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def same_field(offline: Iterable[Problem], triton: str) -> bool:
    named = triton_fields(triton)
    return any(_related(validator_field(p), field) for p in offline for field in named)


def excused(o: Outcome) -> bool:
    """A false accept that its allow-list entry explains: Triton's refusal and the host check's match."""
    excuse = ALLOWED_FALSE_ACCEPTS.get(o.case.name)
    return (excuse is not None and re.search(excuse.triton, o.triton) is not None
            and re.search(excuse.deploy, o.deploy) is not None)


def decided_by_model(o: Outcome) -> bool:
    """A false accept `MODEL_DECIDES` explains: validation warned, Triton's refusal is the method's."""
    return (o.case.name in MODEL_DECIDES and any(w.field == "auto_complete_config" for w in o.warnings)
            and re.search(_MODEL_CODE, o.triton) is not None)


def reason_mismatch(o: Outcome) -> bool:
    return not o.offline_ok and not o.triton_ok and not o.server_died and not same_field(o.offline, o.triton)


def unexpected(outcomes: list[Outcome]) -> list[str]:
    """Disagreements the suite does not accept, one line each."""
    bad = []
    for o in outcomes:
        if o.server_died:  # it cannot be loaded: a refusal, the worst kind (measured: some failing warm-ups)
            if o.offline_ok:
                bad.append(f"{o.case.name}: validation passes a model that killed tritonserver at every attempt "
                           f"to load it: {o.triton[:300]}")
            continue
        if o.verdict == "false_accept" and not excused(o) and not decided_by_model(o):
            excuse = ALLOWED_FALSE_ACCEPTS.get(o.case.name)
            why = f"excused only for {excuse.capability}, but Triton refuses" if excuse else "Triton refuses"
            bad.append(f"{o.case.name}: validation passes, {why}: {o.triton[:300]} | deploy check: "
                       f"{o.deploy or 'passes'}")
        if o.verdict == "false_refusal" and o.case.name not in STRICTER:
            bad.append(f"{o.case.name}: validation refuses ({'; '.join(o.offline_lines)[:300]}) but Triton loads it")
        if o.triton_ok and o.deploy:
            bad.append(f"{o.case.name}: the deploy-time host check refuses ({o.deploy}) but Triton loads it")
        if reason_mismatch(o) and o.case.name not in REASON_DIFFERS:
            bad.append(f"{o.case.name}: both refuse, for different fields: validation "
                       f"{sorted({validator_field(p) for p in o.offline})}, Triton {sorted(triton_fields(o.triton))}"
                       f" ({o.triton[:300]})")
    return bad


def report(outcomes: list[Outcome]) -> str:
    """The confusion matrix (rows: validation, columns: Triton), then every disagreement and its reason."""
    cell = {(v, t): 0 for v in (True, False) for t in (True, False)}
    for o in outcomes:
        cell[(o.offline_ok, o.triton_ok)] += 1
    accepts = [o for o in outcomes if o.verdict == "false_accept"]
    decided = [o for o in accepts if decided_by_model(o)]
    content = [o for o in accepts if not excused(o) and not decided_by_model(o)]
    both = [o for o in outcomes if not o.offline_ok and not o.triton_ok and not o.server_died]
    mismatched = [o for o in both if reason_mismatch(o)]
    kills = [o for o in outcomes if o.server_died]
    completing = sum(1 for o in outcomes if o.case.category == "auto_complete")
    lines = [
        f"{len(outcomes)} cases",
        f"{'':22}{'Triton loads':>14}{'Triton refuses':>16}",
        f"{'validation passes':22}{cell[(True, True)]:>14}{cell[(True, False)]:>16}",
        f"{'validation refuses':22}{cell[(False, True)]:>14}{cell[(False, False)]:>16}",
        f"content false accepts: {len(content)}; host-dependent, excused by reason: "
        f"{len(accepts) - len(content) - len(decided)}; decided by the model's code at load, warned: {len(decided)}",
        f"auto-completed configs (category auto_complete): {completing} cases",
        f"both refuse: {len(both)}, naming the same field: {len(both) - len(mismatched)}, "
        f"different fields: {len(mismatched)}; killed tritonserver at every attempt: {len(kills)}",
    ]
    for o in accepts:
        excuse = ALLOWED_FALSE_ACCEPTS.get(o.case.name)
        if excused(o) and excuse is not None:
            lines.append(f"  excused       {o.case.name}: needs {excuse.capability} | deploy check: {o.deploy} | "
                         f"Triton: {_reason(o.triton)[:160]}")
        elif decided_by_model(o):
            lines.append(f"  model decides {o.case.name}: {MODEL_DECIDES[o.case.name]} | "
                         f"Triton: {_reason(o.triton)[:160]}")
        else:
            lines.append(f"  FALSE ACCEPT  {o.case.name}: Triton: {_reason(o.triton)[:200]} | deploy check: "
                         f"{o.deploy or 'passes'}")
    for o in outcomes:
        if o.verdict == "false_refusal":
            why = STRICTER.get(o.case.name, "NOT DOCUMENTED")
            lines.append(f"  stricter      {o.case.name}: {why} | {'; '.join(o.offline_lines)[:160]}")
    for o in kills:
        lines.append(f"  kills Triton  {o.case.name}: tritonserver died at every attempt to load it | "
                     f"validation {'PASSES' if o.offline_ok else 'refuses'}: {'; '.join(o.offline_lines)[:160]}")
    for o in mismatched:
        why = REASON_DIFFERS.get(o.case.name, "NOT EXPLAINED")
        lines.append(f"  other field   {o.case.name}: {why} | validation "
                     f"{sorted({validator_field(p) for p in o.offline})} | Triton {sorted(triton_fields(o.triton))}: "
                     f"{_reason(o.triton)[:160]}")
    return "\n".join(lines)


def _reason(message: str) -> str:
    """Triton's reason: what its log says when it has something, else its answer."""
    return message.split(" | log: ", 1)[1] if " | log: " in message else message


def describe(o: Outcome) -> str:
    """One line per case (`--report -v`)."""
    fields = "" if o.triton_ok else f" fields={sorted(triton_fields(o.triton))}"
    return (f"{o.verdict:14} {o.case.name:32} offline={'ok' if o.offline_ok else 'refuses'} "
            f"triton={'loads' if o.triton_ok else 'refuses'} {o.load_s:.2f}s{fields} | "
            f"{'; '.join(o.offline_lines)[:150]} | {_reason(o.triton)[:200]}")


# The default suite's sample: every category, valid and invalid, chosen for cheap loads (each valid
# python model starts a stub process; a failing warmup costs a started instance too), with one
# excused host-dependent case and the batch_input type that once passed validation.
SAMPLE = (
    "dims_basic", "dims_zero", "reshape_count", "type_string", "policy_specific_absent", "name_mismatch",
    "instances_cpu_gpus", "instances_count_zero", "dyn_preferred", "dyn_prio_policy_key_above", "seq_oldest",
    "seq_corrid_no_type", "bi_unknown_source", "bi_type_string", "warm_zero", "warm_wrong_type",
    "warm_file_missing", "label_missing", "env_missing", "env_missing_abs", "ens_ok", "ens_bad_input_key",
    "ens_unused_input", "ens_mbs_above_step", "parse_unknown_field", "prio_policy_key_far", "prio_levels_no_default",
    "ens_nested_type_mismatch", "ac_no_config", "ac_conflict_dims", "ac_raises_at_load", "ac_no_config_no_method",
)


def sample(cases: list[Case] | None = None) -> list[Case]:
    """The default suite's cases (`SAMPLE`), in generation order."""
    cases = cases if cases is not None else all_cases()
    return [c for c in cases if c.name in SAMPLE]
