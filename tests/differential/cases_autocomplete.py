"""Cases of python models whose config their `auto_complete_config` completes at load (issue 57): no
config.pbtxt, a partial one, one whose tensors or max_batch_size conflict with what the method always sets,
a method that always fails and one that fails only at load, and the stricter refusals of a model that
nothing completes. The suite's tritonserver completes configs, as the daemon's does by default
(`triton_auto_complete`); each model answers any completed config (casekit's MODEL_PY)."""

from __future__ import annotations

from tests.differential.casekit import MODEL_PY, Builder

CLASS = "class TritonPythonModel:\n"
DECLARE = ('config.add_input({"name": "x", "data_type": "TYPE_FP32", "dims": [3]})',
           'config.add_output({"name": "y", "data_type": "TYPE_FP32", "dims": [1]})',
           "config.set_max_batch_size(4)")


def with_method(*body: str, decorator: str = "    @staticmethod\n", head: str = "") -> str:
    """casekit's model with an auto_complete_config whose body is `body` (then `return config`)."""
    lines = "".join(f"        {line}\n" for line in (*body, "return config"))
    method = f"{decorator}    def auto_complete_config(config):\n{lines}\n"
    return head + MODEL_PY.replace(CLASS, CLASS + method, 1)


def completes(b: Builder) -> None:
    c = "auto_complete"
    b.one("ac_no_config", c, None, True, code=with_method(*DECLARE))
    b.one("ac_partial_backend", c, 'backend: "python"\n', True, code=with_method(*DECLARE))
    b.one("ac_partial_stamp_only", c, 'parameters { key: "tritonctl.digest" value { string_value: "d" } }\n', True,
          "what a publish writes for a model without config.pbtxt", code=with_method(*DECLARE))
    b.one("ac_partial_other_input", c, 'backend: "python"\ninput [ { name: "z" data_type: TYPE_FP32 dims: [ 3 ] } ]\n',
          True, "the method adds x beside z", code=with_method(*DECLARE))
    b.one("ac_dynamic_batching", c, None, True, code=with_method(*DECLARE, "config.set_dynamic_batching()"))
    b.one("ac_adds_what_is_missing", c, 'backend: "python"\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 5 ] } ]\n',
          True, "adds x only when the config lacks it: the config's dims stand",
          code=with_method('if not [t for t in config.as_dict()["input"] if t["name"] == "x"]:',
                           '    ' + DECLARE[0], DECLARE[1], DECLARE[2]))
    b.one("ac_inherited", c, None, True, "the method comes from a base class: validation can only warn",
          code=_inherited())
    b.one("ac_conflict_dims", c, 'backend: "python"\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]\n',
          False, code=with_method(*DECLARE))
    b.one("ac_conflict_type", c, 'backend: "python"\noutput [ { name: "y" data_type: TYPE_INT32 dims: [ 1 ] } ]\n',
          False, code=with_method(*DECLARE))
    b.one("ac_mbs_above", c, 'backend: "python"\nmax_batch_size: 16\n', False, code=with_method(*DECLARE))
    b.one("ac_raises", c, None, False, code=with_method(*DECLARE, 'raise RuntimeError("no completion")'))
    b.one("ac_undefined_name", c, None, False, code=with_method(*DECLARE, "undefined_variable"),
          note="Triton's QA auto_complete_error: a NameError")
    b.one("ac_returns_none", c, None, False, code=with_method(*DECLARE).replace("        return config\n",
                                                                                  "        return None\n", 1))
    b.one("ac_bad_data_type", c, None, False, code=with_method(DECLARE[0].replace("TYPE_FP32", "FP32"), *DECLARE[1:]))
    b.one("ac_raises_at_load", c, None, False, "raises only at load (the config it is given has no input): "
          "the model's code decides, validation warns",
          code=with_method('if not config.as_dict()["input"]:', '    raise ValueError("declare x in config.pbtxt")',
                           *DECLARE))
    b.one("ac_no_config_no_method", c, None, True, "stricter: loads with no inputs and no outputs")
    b.one("ac_partial_no_io_no_method", c, 'backend: "python"\nmax_batch_size: 4\n', True,
          "stricter: loads with no inputs and no outputs")


def _inherited() -> str:
    base = "class Base:\n    @staticmethod\n    def auto_complete_config(config):\n" + "".join(
        f"        {line}\n" for line in (*DECLARE, "return config")) + "\n\n"
    return MODEL_PY.replace(CLASS, base + "class TritonPythonModel(Base):\n", 1)
