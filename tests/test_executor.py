"""The parser reads both forms models write; results render exactly as bfcl-eval renders them."""

from rcgrpo.bfcl.dispatch import dispatch, format_result
from rcgrpo.bfcl.executor import Call, parse_calls


def names(text):
    parsed = parse_calls(text)
    assert not parsed.errors, parsed.errors
    return [(c.name, c.args, c.kwargs) for c in parsed.calls]


def test_python_call_syntax_single_and_list():
    assert names("cd(folder='document')") == [("cd", (), {"folder": "document"})]
    assert names("[cd(folder='a'), ls(a=True), sort('f.txt')]") == [
        ("cd", (), {"folder": "a"}),
        ("ls", (), {"a": True}),
        ("sort", ("f.txt",), {}),
    ]
    assert names("mean(numbers=[1, -2.5, 3])") == [("mean", (), {"numbers": [1, -2.5, 3]})]
    assert names("cd(folder='a')\nls()") == [("cd", (), {"folder": "a"}), ("ls", (), {})]


def test_json_forms_bare_list_tagged_and_parameters_key():
    assert names('{"name": "cd", "arguments": {"folder": "x"}}') == [("cd", (), {"folder": "x"})]
    assert names('[{"name": "ls", "arguments": {}}, {"name": "pwd", "arguments": {}}]') == [
        ("ls", (), {}),
        ("pwd", (), {}),
    ]
    text = (
        'Sure.\n<tool_call>\n{"name": "cd", "arguments": {"folder": "a"}}\n</tool_call>\n'
        '<tool_call>{"name": "ls", "parameters": {"a": true}}</tool_call>'
    )
    assert names(text) == [("cd", (), {"folder": "a"}), ("ls", (), {"a": True})]
    assert names('{"name": "cd", "arguments": "{\\"folder\\": \\"b\\"}"}') == [
        ("cd", (), {"folder": "b"})
    ]
    assert names('```json\n{"name": "ls", "arguments": {}}\n```') == [("ls", (), {})]


def test_python_call_inside_tool_call_tag_and_fence():
    assert names("<tool_call>[cd(folder='a')]</tool_call>") == [("cd", (), {"folder": "a"})]
    assert names("```python\n[ls()]\n```") == [("ls", (), {})]


def test_plain_prose_is_no_call_and_no_error():
    parsed = parse_calls("The file has been moved to the temp folder.")
    assert parsed.calls == [] and parsed.errors == [] and not parsed.attempted


def test_malformed_calls_give_errors_that_say_what():
    parsed = parse_calls("cd(folder='a'")
    assert not parsed.calls and "not a valid call" in parsed.errors[0]
    parsed = parse_calls('{"name": "cd", "arguments": {"folder": }}')
    assert "malformed JSON" in parsed.errors[0]
    assert "must be an object" in parse_calls('{"name": "cd", "arguments": [1]}').errors[0]


def test_call_str_is_bfcl_python_form_and_round_trips():
    call = Call("mv", (), {"source": "a b.txt", "destination": "it's"})
    assert str(call) == "mv(source='a b.txt', destination=\"it's\")"
    assert parse_calls(str(call)).calls == [call]


def test_format_result_matches_bfcl_eval():
    assert format_result("x") == "x"
    assert format_result({"a": 1}) == '{"a": 1}'
    assert format_result([1]) == "[1]" and format_result(None) == "None"


def test_dispatch_turns_tool_errors_into_observations():
    def tool(x: int):
        raise ValueError(f"bad {x}")

    assert dispatch(Call("tool", (3,)), {"tool": tool}) == (False, "Error during execution: bad 3")
    ok, message = dispatch(Call("tool", (), {"y": 1}), {"tool": tool})
    assert not ok and "unexpected keyword argument 'y'" in message
    ok, message = dispatch(Call("nope"), {"tool": tool})
    assert not ok and "'nope' is not available" in message


def test_model_text_never_prints_syntax_warnings(capfd):
    import warnings

    # `1or 2` makes Python's parser warn "invalid decimal literal" (seen in tiny-model output)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        parsed = parse_calls("[f(a=1or 2)]")
    assert not parsed.calls and parsed.errors  # refused (a BoolOp is no literal), quietly
    assert not [w for w in seen if w.category is SyntaxWarning]
    assert capfd.readouterr().err == ""


# a fence that never closes around 31,980 newlines (the 32,000-character cap), and 2,900 opening
# tags with no closing one; the reference is the same fence closed (linear then as now)
TIMED = """
import time
from rcgrpo.bfcl.executor import parse_calls
n = 31_980
cases = {
    "reference": "```\\n" + "\\n" * n + "ls()```",
    "open fence": "```\\n" + "\\n" * n + "ls()",
    "open tags": "<tool_call>" * 2_900,
}
for name, text in cases.items():
    start = time.process_time()
    parsed = parse_calls(text)
    print(f"{name}|{time.process_time() - start:.6f}|{len(parsed.calls)}|{len(parsed.errors)}")
"""


def test_fenced_newlines_and_open_tags_parse_in_linear_time():
    """The fence and tag regexes backtracked over every split of a run of newlines without a
    closing fence, and rescanned the rest from every unclosed <tool_call>: a 1,003-token message
    of newlines cost 42 s of CPU, this 31,980-newline one minutes. Each must take under a
    second of CPU time, or under 100x the closed fence of the same length if that is longer
    (same run), in a child process the test stops after 60 s."""
    import subprocess
    import sys

    try:
        done = subprocess.run(
            [sys.executable, "-c", TIMED], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        raise AssertionError("parse_calls took over 60 s on one 32,000-character message") from None
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split("|") for line in done.stdout.splitlines()]
    took = {name: float(s) for name, s, _, _ in rows}
    print(took)
    for name in ("open fence", "open tags"):
        assert took[name] < max(1.0, 100 * took["reference"]), (name, took)
    assert [(c, e) for _, _, c, e in rows] == [("1", "0"), ("0", "0"), ("0", "0")]
