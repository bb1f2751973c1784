"""benchmarks/subject_emphasis.py's query composition: which words are a caption's subject, and how much they add."""
import numpy as np

from benchmarks.subject_emphasis import composed, subject


def test_the_subject_ends_at_the_first_preposition_auxiliary_or_relative_word():
    assert subject("An ornate temple with a tiled roof under a blue sky") == "an ornate temple"
    assert subject("a man stands outside with a camera on a tripod") == "a man stands"
    assert subject("A dog is running through the grass .") == "a dog"
    assert subject("a boy who likes trains") == "a boy"


def test_of_and_particles_stay_in_the_subject_and_a_leading_boundary_word_does_not_end_it():
    assert subject("a cup of coffee on a saucer") == "a cup of coffee"
    assert subject("a close up of green grass") == "a close up of green grass"
    assert subject("on the beach at sunset") == "on the beach"
    assert subject("a red brick wall") == "a red brick wall"


def test_composition_adds_the_subject_and_leaves_a_text_that_is_all_subject_as_it_is():
    rng = np.random.default_rng(0)
    full = rng.normal(size=(3, 8)).astype(np.float32)
    full /= np.linalg.norm(full, axis=1, keepdims=True)
    parts = rng.normal(size=(3, 8)).astype(np.float32)
    parts /= np.linalg.norm(parts, axis=1, keepdims=True)
    whole = np.array([False, True, False])
    assert np.allclose(composed(full, parts, whole, 0.0), full, atol=1e-6)
    q = composed(full, parts, whole, 1.0)
    assert np.allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-6)
    assert np.allclose(q[1], full[1], atol=1e-6)
    expected = (full[0] + parts[0]) / np.linalg.norm(full[0] + parts[0])
    assert np.allclose(q[0], expected, atol=1e-6)
    assert float(q[2] @ parts[2]) > float(full[2] @ parts[2])
