"""Cases of the schedulers and what they feed the model: dynamic batching with its priority levels
and queue policies, sequence batching with its controls and strategies, batch inputs."""

from __future__ import annotations

from tests.differential.casekit import TYPES, Builder, simple


def dynamic(b: Builder) -> None:
    c = "dynamic_batching"
    b.one("dyn_plain", c, simple("dynamic_batching { }"), True)
    b.one("dyn_preferred", c, simple("dynamic_batching { preferred_batch_size: [ 2, 4 ] "
                                     "max_queue_delay_microseconds: 100 }"), True)
    b.one("dyn_preferred_above", c, simple("dynamic_batching { preferred_batch_size: [ 8 ] }"), False)
    b.one("dyn_preferred_zero", c, simple("dynamic_batching { preferred_batch_size: [ 0 ] }"), False)
    b.one("dyn_no_batching", c, simple("dynamic_batching { }", mbs=0), True, "stricter: nothing is ever batched")
    b.one("dyn_preserve", c, simple("dynamic_batching { preserve_ordering: true }"), True)
    b.one("dyn_priority", c, simple("dynamic_batching { priority_levels: 3 default_priority_level: 2 }"), True)
    b.one("dyn_priority_default_out", c, simple("dynamic_batching { priority_levels: 3 default_priority_level: 4 }"),
          False)
    b.one("dyn_queue_policy", c, simple("dynamic_batching { default_queue_policy { max_queue_size: 8 "
                                        "timeout_action: REJECT default_timeout_microseconds: 1000 } }"), True)
    b.one("dyn_prio_policy_ok", c, simple("dynamic_batching { priority_levels: 2 default_priority_level: 1 "
                                          "priority_queue_policy { key: 2 value { max_queue_size: 4 } } }"), True)
    b.one("dyn_prio_policy_key_above", c, simple("dynamic_batching { priority_levels: 2 default_priority_level: 1 "
                                                 "priority_queue_policy { key: 3 value { max_queue_size: 4 } } }"),
          False)
    b.one("dyn_prio_policy_key_zero", c, simple("dynamic_batching { priority_levels: 2 default_priority_level: 1 "
                                                "priority_queue_policy { key: 0 value { max_queue_size: 4 } } }"),
          False)
    b.one("dyn_prio_policy_no_levels", c, simple("dynamic_batching { priority_queue_policy { key: 1 "
                                                 "value { max_queue_size: 4 } } }"), False)
    _priority_queues(b)


def _dyn(body: str) -> str:
    return simple(f"dynamic_batching {{ {body} }}")


def _policy(key: int, value: str) -> str:
    return f"priority_queue_policy {{ key: {key} value {{ {value} }} }}"


def _priority_queues(b: Builder) -> None:
    """Priority levels and their queue policies (dynamic batching only)."""
    c = "priority_queue"
    levels = "priority_levels: 3 default_priority_level: 2"
    b.one("prio_levels_no_default", c, _dyn("priority_levels: 3"), False)
    b.one("prio_default_no_levels", c, _dyn("default_priority_level: 2"), None)
    b.one("prio_default_zero_levels", c, _dyn("priority_levels: 2 default_priority_level: 0"), False)
    b.one("prio_many_levels", c, _dyn("priority_levels: 100 default_priority_level: 50"), True)
    b.one("prio_one_level", c, _dyn("priority_levels: 1 default_priority_level: 1"), True)
    b.one("prio_policy_every_level", c, _dyn(f"{levels} {_policy(1, 'max_queue_size: 2')} "
                                             f"{_policy(2, 'max_queue_size: 4')} {_policy(3, 'max_queue_size: 8')}"),
          True)
    b.one("prio_policy_delay", c, _dyn(f"{levels} " + _policy(1, "timeout_action: DELAY "
                                                                 "default_timeout_microseconds: 5000 "
                                                                 "allow_timeout_override: true")), True)
    b.one("prio_policy_key_far", c, _dyn(f"{levels} {_policy(1, 'max_queue_size: 2')} "
                                         f"{_policy(1000, 'max_queue_size: 2')}"), False)
    b.one("prio_policy_key_negative", c, _dyn(f"{levels} {_policy(-1, 'max_queue_size: 2')}"), False,
          "keys are uint64: a parse error")
    b.one("prio_policy_unknown_action", c, _dyn(f"{levels} {_policy(1, 'timeout_action: DROP')}"), False,
          "a parse error")
    b.one("prio_default_policy_with_levels", c, _dyn(f"{levels} default_queue_policy {{ max_queue_size: 4 "
                                                     "timeout_action: REJECT default_timeout_microseconds: 100 }"),
          True)
    b.one("prio_with_preferred", c, _dyn(f"{levels} preferred_batch_size: [ 2, 4 ] "
                                         f"{_policy(3, 'max_queue_size: 1')}"), True)
    b.one("prio_default_above_with_policy", c, _dyn(f"priority_levels: 2 default_priority_level: 3 "
                                                    f"{_policy(1, 'max_queue_size: 1')}"), False)
    b.one("dyn_preferred_equal_max", c, _dyn("preferred_batch_size: [ 4 ]"), True)
    b.one("dyn_preferred_unsorted", c, _dyn("preferred_batch_size: [ 4, 2, 3 ]"), True)
    b.one("dyn_preferred_negative", c, _dyn("preferred_batch_size: [ -2 ]"), False)


_SEQ_IN = '{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] }'


def _control(name: str, kind: str, body: str) -> str:
    return f'{{ name: "{name}" control [ {{ kind: {kind} {body} }} ] }}'


def _seq(controls: str, strategy: str = "") -> str:
    return f"sequence_batching {{ {strategy} control_input [ {controls} ] }}"


def sequence(b: Builder) -> None:
    c = "sequence_batching"
    start = _control("START", "CONTROL_SEQUENCE_START", "int32_false_true: [ 0, 1 ]")
    ready = _control("READY", "CONTROL_SEQUENCE_READY", "int32_false_true: [ 0, 1 ]")
    end = _control("END", "CONTROL_SEQUENCE_END", "bool_false_true: [ false, true ]")
    corr = _control("CORRID", "CONTROL_SEQUENCE_CORRID", "data_type: TYPE_UINT64")
    b.one("seq_plain", c, simple("sequence_batching { }"), True)
    b.one("seq_direct", c, simple(_seq(f"{start}, {ready}", "direct { }")), True)
    b.one("seq_oldest", c, simple(_seq(f"{start}, {ready}, {end}, {corr}",
                                       "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] }")), True)
    b.one("seq_oldest_pref_above", c, simple(_seq(start, "oldest { max_candidate_sequences: 4 "
                                                         "preferred_batch_size: [ 8 ] }")), False)
    b.one("seq_fp32_control", c, simple(_seq(_control("S", "CONTROL_SEQUENCE_START", "fp32_false_true: [ 0, 1 ]"))),
          True)
    b.one("seq_no_bool_values", c, simple(_seq(_control("S", "CONTROL_SEQUENCE_START", ""))), False)
    b.one("seq_three_values", c, simple(_seq(_control("S", "CONTROL_SEQUENCE_START", "int32_false_true: [ 0, 1, 2 ]"))),
          False)
    b.one("seq_one_value", c, simple(_seq(_control("S", "CONTROL_SEQUENCE_READY", "int32_false_true: [ 1 ]"))), False)
    b.one("seq_two_kinds_values", c, simple(_seq(_control("S", "CONTROL_SEQUENCE_END", "int32_false_true: [ 0, 1 ] "
                                                                                      "fp32_false_true: [ 0, 1 ]"))),
          False)
    b.one("seq_corrid_no_type", c, simple(_seq(_control("C", "CONTROL_SEQUENCE_CORRID", ""))), False)
    b.one("seq_corrid_fp32", c, simple(_seq(_control("C", "CONTROL_SEQUENCE_CORRID", "data_type: TYPE_FP32"))), False)
    b.one("seq_corrid_string", c, simple(_seq(_control("C", "CONTROL_SEQUENCE_CORRID", "data_type: TYPE_STRING"))),
          True)
    b.one("seq_start_twice", c, simple(_seq(f"{start}, " + _control("S2", "CONTROL_SEQUENCE_START",
                                                                     "int32_false_true: [ 0, 1 ]"))), False)
    b.one("seq_no_name", c, simple(_seq(_control("", "CONTROL_SEQUENCE_START", "int32_false_true: [ 0, 1 ]"))), False)
    b.one("seq_start_with_type", c, simple(_seq(_control("S", "CONTROL_SEQUENCE_START",
                                                         "int32_false_true: [ 0, 1 ] data_type: TYPE_INT32"))), None)
    b.one("seq_idle", c, simple("sequence_batching { max_sequence_idle_microseconds: 5000000 }"), True)
    b.one("seq_nobatch", c, simple(_seq(start), mbs=0), True)
    b.one("seq_oldest_delay", c, simple(_seq(start, "oldest { max_candidate_sequences: 2 "
                                                    "max_queue_delay_microseconds: 100 }")), True)
    b.one("seq_oldest_pref_zero", c, simple(_seq(start, "oldest { max_candidate_sequences: 4 "
                                                        "preferred_batch_size: [ 0 ] }")), False)
    b.one("seq_direct_slots", c, simple(_seq(start, "direct { max_queue_delay_microseconds: 100 "
                                                    "minimum_slot_utilization: 0.5 }")), True)
    ready_bool = _control("R", "CONTROL_SEQUENCE_READY", "bool_false_true: [ false, true ]")
    b.one("seq_ready_bool", c, simple(_seq(ready_bool)), True)
    b.one("seq_corrid_int32", c, simple(_seq(_control("C", "CONTROL_SEQUENCE_CORRID", "data_type: TYPE_INT32"))),
          True)
    b.one("seq_corrid_bool", c, simple(_seq(_control("C", "CONTROL_SEQUENCE_CORRID", "data_type: TYPE_BOOL"))), False)
    b.one("seq_corrid_with_values", c, simple(_seq(_control("C", "CONTROL_SEQUENCE_CORRID",
                                                            "data_type: TYPE_UINT64 int32_false_true: [ 0, 1 ]"))),
          None)
    b.one("seq_end_one_fp32", c, simple(_seq(_control("E", "CONTROL_SEQUENCE_END", "fp32_false_true: [ 1 ]"))), False)
    b.one("seq_two_controls_one_input", c,
          simple('sequence_batching { control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START '
                 'int32_false_true: [ 0, 1 ] }, { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] } ] }'),
          None)
    b.one("seq_control_named_as_input", c, simple(_seq(_control("x", "CONTROL_SEQUENCE_START",
                                                                "int32_false_true: [ 0, 1 ]"))), None)
    b.one("seq_and_dynamic", c, simple("sequence_batching { }\ndynamic_batching { }"), False,
          "scheduling_choice is a oneof")
    b.one("seq_state", c, simple("sequence_batching { state [ { input_name: \"IN_STATE\" output_name: \"OUT_STATE\" "
                                 "data_type: TYPE_FP32 dims: [ 1 ] } ] }"), None)
    b.one("seq_state_no_dims", c, simple("sequence_batching { state [ { input_name: \"IN_STATE\" "
                                         "output_name: \"OUT_STATE\" data_type: TYPE_FP32 } ] }"), None)
    b.one("seq_state_no_names", c, simple("sequence_batching { state [ { data_type: TYPE_FP32 dims: [ 1 ] } ] }"), None)


def batch_input(b: Builder) -> None:
    c = "batch_input"
    b.one("bi_ok", c, simple("batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: \"n\" data_type: TYPE_FP32 "
                             "source_input: \"x\" } ]"), True)
    b.one("bi_unknown_source", c, simple("batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: \"n\" "
                                         "data_type: TYPE_FP32 source_input: \"nosuch\" } ]"), False)
    b.one("bi_no_source", c, simple("batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: \"n\" "
                                    "data_type: TYPE_FP32 } ]"), False)
    b.one("bi_two_sources", c, simple("batch_input [ { kind: BATCH_ITEM_SHAPE target_name: \"n\" data_type: TYPE_FP32 "
                                      "source_input: [ \"x\", \"x\" ] } ]"), None)
    b.one("bi_max_shape", c, simple("batch_input [ { kind: BATCH_MAX_ELEMENT_COUNT_AS_SHAPE target_name: \"n\" "
                                    "data_type: TYPE_INT32 source_input: \"x\" } ]"), True)
    b.one("bi_no_target", c, simple("batch_input [ { kind: BATCH_ELEMENT_COUNT data_type: TYPE_FP32 "
                                    "source_input: \"x\" } ]"), None)
    b.one("bi_no_type", c, _bi("BATCH_ELEMENT_COUNT", ""), False)
    # Every data type for one kind, and the two Triton takes plus one it does not for every other kind
    # (measured on 2.51: all six kinds take exactly TYPE_INT32 and TYPE_FP32).
    for dtype in TYPES:
        if dtype != "TYPE_FP32":  # bi_ok
            b.one(f"bi_type_{dtype.removeprefix('TYPE_').lower()}", c, _bi("BATCH_ELEMENT_COUNT", dtype),
                  dtype == "TYPE_INT32")
    for kind in _BATCH_INPUT_KINDS[1:]:
        short = kind.removeprefix("BATCH_").lower()
        for dtype in ("TYPE_INT32", "TYPE_FP32", "TYPE_STRING"):
            b.one(f"bi_{short}_{dtype.removeprefix('TYPE_').lower()}", c, _bi(kind, dtype), dtype != "TYPE_STRING")
    b.one("bi_nobatch", c, simple(_bi_text("BATCH_ELEMENT_COUNT", "TYPE_INT32"), mbs=0), None)
    b.one("bi_target_is_input", c, simple(_bi_text("BATCH_ELEMENT_COUNT", "TYPE_INT32", target="x")), None)
    b.one("bi_two_entries", c, simple('batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "n" '
                                      'data_type: TYPE_INT32 source_input: "x" }, { kind: BATCH_ITEM_SHAPE '
                                      'target_name: "s" data_type: TYPE_FP32 source_input: "x" } ]'), True)


_BATCH_INPUT_KINDS = ("BATCH_ELEMENT_COUNT", "BATCH_ACCUMULATED_ELEMENT_COUNT",
                      "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE",
                      "BATCH_ITEM_SHAPE", "BATCH_ITEM_SHAPE_FLATTEN")


def _bi_text(kind: str, dtype: str, target: str = "n") -> str:
    dtype_field = f"data_type: {dtype} " if dtype else ""
    return f'batch_input [ {{ kind: {kind} target_name: "{target}" {dtype_field}source_input: "x" }} ]'


def _bi(kind: str, dtype: str) -> str:
    return simple(_bi_text(kind, dtype))
