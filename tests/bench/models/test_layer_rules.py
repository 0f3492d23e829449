"""The layer rules of bench/ (docs/architecture.md): report -> models, cases -> models, never back."""
import ast
from pathlib import Path

import pytest

from bench.models import MODELS, get_model
from bench.registry import SUITES, get_case

BENCH = Path(__file__).resolve().parents[3] / "bench"


def imported_modules(path):
    """Every module ``path`` imports (absolute names; ``from a import b`` gives ``a`` and ``a.b``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("folder, forbidden", [
    ("models", ("bench.case", "bench.cases", "bench.registry", "bench.families", "bench.report")),
    ("report", ("bench.case", "bench.cases", "bench.registry")),
])
def test_models_and_report_never_import_cases(folder, forbidden):
    for path in sorted((BENCH / folder).glob("*.py")):
        wrong = {name for name in imported_modules(path)
                 if any(name == bad or name.startswith(bad + ".") for bad in forbidden)}
        assert not wrong, f"{path.name} imports {sorted(wrong)}"


def test_no_case_module_imports_another():
    for path in sorted((BENCH / "cases").glob("*.py")):
        others = {name for name in imported_modules(path) if name.startswith("bench.cases.")}
        assert not others, f"{path.name} imports {sorted(others)}"


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_every_suite_has_a_model_whose_facts_its_case_states(suite):
    assert set(MODELS) == set(SUITES)
    case, model = get_case(suite), get_model(suite)
    assert type(case.model) is type(model)
    for fact in ("name", "variants", "size_unit", "declared_settings", "superlinear_reasons", "host_only_variants",
                 "device_only_variants"):
        assert getattr(case, fact) == getattr(model, fact), fact


def test_a_custom_case_has_no_model_module_but_the_default_model():
    from tests.fake_cases import TinyCase

    case = TinyCase()
    assert get_model(case.name) is None and case.model.predict("only", 4, 2, {}) is None
    assert case.model.memory_bytes(1000, 2, "only", "float64") == 0  # size unit "items": nothing estimated
    assert case.model.problem_size(4, 3, "weak") == 12 and case.model.variants == case.variants
