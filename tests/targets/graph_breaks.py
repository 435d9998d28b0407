"""A user script whose compiled function breaks its graph the way debugging code and Python control
flow do, one kind per argument:

`print`: a print() in a helper the compiled function calls (dynamo breaks at the print twice: in the
compiled function, then in the helper as it resumes). `item`: a Python `if` on `.item()`. `branch`:
a Python `if` on a tensor (dynamo's `graph_break` counter misses this one; `torch._dynamo.explain`
and dynamo's list of breaks have it). `healthy`: no break.

`hf`: a tiny HF Llama (transformers, random weights) with attn_implementation="flex_attention",
compiled whole as users compile it: transformers builds the mask with
`create_block_mask(..., _compile=True)`, whose deprecation warning dynamo cannot trace. The fixes the
report offers: `--ignore-warn` adds warnings.warn to dynamo's ignore_logging_functions, `--layers`
compiles the decoder layers instead of the model.

`--truth` runs the same code and then prints, as JSON, what dynamo itself counted: its `graph_break`
counter and `torch._dynamo.explain`'s break count (run first: explain resets dynamo, though not the
counter). The tests compare the report with these, taken in a process dflashdoctor never touched.
Explain counts graphs less one, which for a model whose mask code calls torch.compile itself is not a
count of breaks.
"""

import json
import sys
import warnings

import torch


def helper(x: torch.Tensor) -> torch.Tensor:
    print("helper ran")  # the print line
    return x + 1


def with_print(x: torch.Tensor) -> torch.Tensor:
    return helper(x * 2).cos()


def with_item(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    if y.sum().item() > 0:  # the item line
        y = y + 1
    return y.cos()


def with_branch(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    if y.sum() > 0:  # the branch line
        y = y + 1
    return y.cos()


def healthy(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).cos()


FUNCTIONS = {"print": with_print, "item": with_item, "branch": with_branch, "healthy": healthy}


def llama() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=256,
    )
    return AutoModelForCausalLM.from_config(config, attn_implementation="flex_attention").eval()


def run(name: str) -> None:
    if name != "hf":
        compiled = torch.compile(FUNCTIONS[name], backend="eager")
        for _ in range(2):
            compiled(torch.ones(4))
        return
    if "--ignore-warn" in sys.argv:
        torch._dynamo.config.ignore_logging_functions.add(warnings.warn)
    model = llama()
    if "--layers" in sys.argv:
        for layer in model.model.layers:
            layer.compile()
    else:
        model = torch.compile(model)
    with torch.no_grad():  # flex_attention has no CPU backward
        for _ in range(2):
            model(input_ids=torch.randint(0, 256, (1, 32)))


def explained(name: str) -> int:
    if name != "hf":
        return torch._dynamo.explain(FUNCTIONS[name])(torch.ones(4)).graph_break_count
    if "--ignore-warn" in sys.argv:
        torch._dynamo.config.ignore_logging_functions.add(warnings.warn)
    with torch.no_grad():
        return torch._dynamo.explain(llama())(input_ids=torch.randint(0, 256, (1, 32))).graph_break_count


if __name__ == "__main__":
    if "--truth" in sys.argv:
        explain = explained(sys.argv[1])
        before = sum(torch._dynamo.utils.counters["graph_break"].values())  # reset() leaves the counters be
        run(sys.argv[1])
        counter = sum(torch._dynamo.utils.counters["graph_break"].values()) - before
        print(json.dumps({"counter": counter, "explain": explain}))
    else:
        run(sys.argv[1])
