"""Whatever bytes a user hands `orchestrator validate|run|submit`, the answer is one line naming
the problem, exit status 2, no traceback, with the limit it hit named (how much CPU the worst of
them cost, against its goal: bench/cpu_bounds.py).

The table: input bytes -> words the one-line error must contain.
"""

import pytest

from core.spec import MAX_SPEC_BYTES, SpecError, load_spec
from workers.checks import job_problems

VALID = (
    "name: t\n"  # line 1
    "model: {family: vit, preset: vit_micro}\n"
    "data: {source: digits, batch_size: 32}\n"
    "train: {steps: 10}\n"  # line 4
)


def spec(extra: str = "", **replace: str) -> bytes:
    """The valid spec with a section replaced (train="...") or lines appended."""
    text = VALID
    for section, value in replace.items():
        text = "".join(
            f"{section}: {value}\n" if line.startswith(f"{section}:") else line + "\n"
            for line in text.splitlines()
        )
    return (text + extra).encode()


def laughs(levels: int, width: int) -> bytes:
    """The "billion laughs": each level is `width` aliases of the one before."""
    text = VALID + 'model_notes: &l0 ["lol"]\n'
    for i in range(1, levels + 1):
        text += f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]\n"
    return text.encode()


def alias_chain(length: int) -> bytes:
    """Few aliases, each wrapping the one before: nesting that only shows once expanded."""
    text = "a0: &a0 [1]\n"
    for i in range(1, length + 1):
        text += f"a{i}: &a{i} [*a{i - 1}]\n"
    return text.encode()


CASES = [
    # --- not text, too big, nothing there
    ("latin-1", b"name: caf\xe9\n", "not UTF-8 text: byte 0xe9 at offset 9 (line 1)"),
    ("binary", spec().replace(b"train", b"tr\xff\xfein"), "not UTF-8 text: byte 0xff at offset"),
    ("utf-16", VALID.encode("utf-16"), "not UTF-8 text: byte 0xff at offset 0 (line 1)"),
    ("nul byte", b"name: t\x00\n", "line 1: unacceptable character #x0000"),
    ("control char", spec("optimizer: {name: adamw\x07}\n"), "line 5: unacceptable character #x0007"),
    ("huge file", b"name: t\n" + b"#" * MAX_SPEC_BYTES, "larger than 256 KiB; a job spec is a few KiB"),
    ("empty", b"", "the file is empty"),
    ("only comments", b"# a job\n\n   \n", "the file is empty (nothing but comments and blank lines)"),
    # --- YAML that parses but is refused
    (
        "duplicate key",
        spec() + b"name: u\n",
        "line 5: duplicate key 'name' (first at line 1, again at line 5)",
    ),
    (
        "duplicate nested key",
        spec(train="\n  steps: 10\n  eval_every: 5\n  steps: 20"),
        "line 7: duplicate key 'steps' (first at line 5, again at line 7)",
    ),
    (
        "duplicate in flow",
        spec(train="{steps: 10, steps: 20}"),
        "duplicate key 'steps' (first at line 4, again at",
    ),
    ("billion laughs", laughs(9, 9), "more than 64 aliases"),
    ("wide laughs", laughs(9, 7), "expands to more than 10000 values through anchors and aliases"),
    (
        "recursive alias",
        spec("sweep: &s {method: *s}\n"),
        "line 5: an alias refers to a node that contains it",
    ),
    ("alias chain", alias_chain(40), "nested more than 32 levels deep (through aliases)"),
    (
        "deep nesting",
        b"name: " + b"[" * 5000 + b"]" * 5000 + b"\n",
        "line 1: nested more than 32 levels deep",
    ),
    ("many values", b"v: [" + b"1, " * 20000 + b"1]\n", "more than 10000 values"),
    ("undefined alias", spec("kernels: *k\n"), "found undefined alias 'k'"),
    ("bad date", b"name: 2026-02-30\n", "line 1: cannot read the value '2026-02-30': day is out of range"),
    ("endless integer", spec(train="{steps: " + "9" * 5000 + "}"), "line 4: cannot read the value '999"),
    # --- YAML syntax
    (
        "tab indent",
        spec(train="\n\tsteps: 10"),
        "line 5: a tab character indents this line; YAML indents with",
    ),
    ("tab separator", spec(train="{steps:\t10}"), "line 4, column 15: a tab character"),
    ("unclosed flow", spec(train="{steps: 10"), "YAML syntax error at line 5, column 1"),
    (
        "two documents",
        spec("---\nname: u\n"),
        "YAML syntax error at line 5, column 1: but found another document",
    ),
    # --- the wrong shape
    ("top-level list", b"- name: t\n", "expected a mapping of sections at the top level, got a list"),
    (
        "top-level scalar",
        b"just words\n",
        "expected a mapping of sections at the top level, got str 'just words'",
    ),
    ("section is a list", spec(train="[10]"), "train: expected a mapping of fields (a section), got a list"),
    ("section is a scalar", spec(train="10"), "train: expected a mapping of fields (a section), got int 10"),
    ("section is null", spec(train="null"), "train: expected a mapping of fields (a section), got null"),
    ("value is a mapping", spec(name="{first: t}"), "name: Input should be a valid string (got a mapping)"),
    (
        "value is a list",
        spec(train="{steps: [10]}"),
        "train.steps: Input should be a valid integer (got a list)",
    ),
    (
        "list is a mapping",
        spec("optimizer: {betas: {a: 1}}\n"),
        "optimizer.betas: expected a list, got a mapping",
    ),
    ("key is a number", spec("7: x\n"), "(top level): the key 7 is not a field name"),
    # --- numbers out of range
    (
        "steps",
        spec(train="{steps: 1000000000000}"),
        "train.steps: 1000000000000 is out of range; allowed: 1 to",
    ),
    (
        "epochs",
        spec(train="{epochs: 10000000}"),
        "train.epochs: 10000000 is out of range; allowed: 1 to 1000000",
    ),
    ("batch", spec(data="{source: digits, batch_size: 2097152}"), "data.batch_size: 2097152 is out of range"),
    ("seq_len", spec(data="{source: digits, seq_len: 99999999}"), "data.seq_len: 99999999 is out of range"),
    (
        "workers",
        spec("resources: {num_workers: 5000}\n"),
        "resources.num_workers: 5000 is out of range; allowed: 1",
    ),
    ("seed", spec(train="{steps: 1, seed: 9223372036854775808}"), "allowed: 0 to 9223372036854775807"),
    (
        "priority",
        spec("scheduling: {priority: 1001}\n"),
        "scheduling.priority: 1001 is out of range; allowed: 0",
    ),
    (
        "grace",
        spec("scheduling: {preemption_grace_s: -1}\n"),
        "scheduling.preemption_grace_s: -1 is out of range",
    ),
    ("nan", spec("optimizer: {lr: .nan}\n"), "optimizer.lr: must be a finite number (got nan)"),
    ("inf", spec("optimizer: {lr: .inf}\n"), "optimizer.lr: must be a finite number (got inf)"),
    (
        "-inf",
        spec(train="{steps: 1, clip_grad_norm: -.inf}"),
        "train.clip_grad_norm: must be a finite number",
    ),
    (
        "float overflow",
        spec("optimizer: {lr: 1.0e+999}\n"),
        "optimizer.lr: must be a finite number (got inf)",
    ),
    (
        "int for a float",
        spec("optimizer: {lr: " + "9" * 400 + "}\n"),
        "is out of range; allowed: > 0 and <= 10",
    ),
    (
        "model override",
        spec(model="{family: vit, preset: vit_micro, overrides: {dropout: .nan}}"),
        "model.overrides.dropout: must be a finite number, got nan",
    ),
    (
        "model override size",
        spec(model="{family: vit, preset: vit_micro, overrides: {depth: 100000000000000000000}}"),
        "model.overrides.depth: must be 1 to 1048576, got 100000000000000000000",
    ),
    (
        "old prometheus_port",
        spec("metrics: {prometheus_port: 9100}\n"),
        "metrics.prometheus_port: unknown field",
    ),
]
IDS = [case[0] for case in CASES]


def write(tmp_path, data: bytes):
    path = tmp_path / "job.yaml"
    path.write_bytes(data)
    return path


def problems_of(path, overrides=()) -> list[str]:
    """What `validate` reports: reading and the schema, then the model and data registries."""
    try:
        return job_problems(load_spec(path, list(overrides)))
    except SpecError as err:
        return err.problems


@pytest.mark.parametrize("name,data,words", CASES, ids=IDS)
def test_bad_input_is_one_line(tmp_path, name, data, words):
    problems = problems_of(write(tmp_path, data))
    assert len(problems) == 1, problems
    assert words in problems[0], problems
    assert "\n" not in problems[0] and len(problems[0]) <= 500


def test_validate_exits_2_with_one_line_per_case_and_no_traceback(cli, tmp_path):
    """Every case through the real command, in one `validate` over all of them (one process
    instead of one per case): each file gets exactly its own one-line error."""
    cases = []
    for i, (_, data, words) in enumerate(CASES):
        folder = tmp_path / f"case{i:02d}"
        folder.mkdir()
        cases.append((write(folder, data), words))
    result = cli("validate", *(str(path) for path, _ in cases))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == len(cases), lines
    for path, words in cases:
        mine = [line for line in lines if line.startswith(f"error: {path}: ")]
        assert len(mine) == 1 and words in mine[0], (path, mine)


@pytest.mark.parametrize("command", [["run", "--local"], ["run"], ["submit"]])
@pytest.mark.parametrize("name", ["binary", "wide laughs"])
def test_run_and_submit_read_specs_the_same_way(cli, tmp_path, command, name):
    data, words = next((d, w) for n, d, w in CASES if n == name)
    result = cli(*command, str(write(tmp_path, data)))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    [line] = result.stderr.splitlines()
    assert words in line


@pytest.mark.parametrize(
    "path,words",
    [(".", "is a directory, not a job spec file"), ("missing.yaml", "no such file")],
)
def test_paths_that_are_not_spec_files(cli, tmp_path, path, words):
    result = cli("validate", str(tmp_path / path))
    assert result.returncode == 2 and words in result.stderr
    assert "Traceback" not in result.stderr


def test_billion_laughs_is_refused_at_its_count_of_values(tmp_path):
    path = write(tmp_path, laughs(9, 7))  # 7**9 = 40 million strings once expanded
    with pytest.raises(SpecError, match="expands to more than 10000 values"):
        load_spec(path)


def test_the_largest_file_read_is_parsed_to_the_end(tmp_path):
    """Plain text with spaces is the slowest YAML to scan: a file just under the cap is read,
    not refused for its size."""
    path = write(tmp_path, b"name: " + b"a " * (MAX_SPEC_BYTES // 2 - 8) + b"\n")
    with pytest.raises(SpecError, match="name: must be lowercase letters"):
        load_spec(path)


def test_anchors_merges_and_flow_keys_within_limits_still_work(tmp_path):
    text = VALID.replace(
        "model: {family: vit, preset: vit_micro}",
        "model: {family: vit, preset: vit_micro,"
        " overrides: {kernels: &k {attention: torch, layer_norm: torch}}}",
    )
    text += "kernels:\n  <<: *k\n  attention: triton  # overrides the merged value: not a duplicate\n"
    spec = load_spec(write(tmp_path, text.encode()))
    assert spec.kernels.attention == "triton" and spec.kernels.layer_norm == "torch"
    assert spec.model.overrides["kernels"] == {"attention": "torch", "layer_norm": "torch"}
    # a byte-order mark and Windows line ends are still text
    spec = load_spec(write(tmp_path, b"\xef\xbb\xbf" + VALID.replace("\n", "\r\n").encode()))
    assert spec.train.steps == 10


def test_overrides_are_read_with_the_same_limits(tmp_path):
    path = write(tmp_path, spec())
    with pytest.raises(SpecError, match="train.steps: 1000000000000 is out of range"):
        load_spec(path, ["train.steps=1000000000000"])
    # a value YAML refuses is taken as text, and the field says what it wants
    [problem] = problems_of(path, ["model.overrides.kernels={a: 1, a: 2}"])
    assert problem.startswith("model.overrides.kernels: expected a mapping")


def test_problems_beyond_fifty_are_counted_not_listed():
    err = SpecError([f"f{i}: bad" for i in range(120)], "job.yaml")
    assert len(err.problems) == 50 and err.problems[-1] == "... and 71 more problems"
    assert len(SpecError(["x: " + "y" * 10_000]).problems[0]) == 500


def test_the_cpu_benchmark_times_inputs_the_reader_refuses(tmp_path):
    """bench/cpu_bounds.py times the reader on these (its goals are there, not here): each must
    still be refused with one line, or the benchmark times a happy path."""
    from bench import cpu_bounds

    figures = cpu_bounds.spec_figures(tmp_path)
    assert list(figures) == list(cpu_bounds.SPECS)
    assert all(seconds >= 0 and line and "\n" not in line for seconds, _, line in figures.values()), figures
