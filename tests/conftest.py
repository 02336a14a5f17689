import pytest

from tests.models import model_path


@pytest.fixture(scope="session")
def tiny_model_path() -> str:
    return str(model_path("tiny"))


@pytest.fixture(scope="session")
def small_model_path() -> str:
    return str(model_path("small"))
