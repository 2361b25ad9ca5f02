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
