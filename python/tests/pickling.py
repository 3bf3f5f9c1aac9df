"""A wrapped model through torch.save and torch.load, as a user pickles a whole model."""
import io
import pickle

import torch


def loaded_without_stowage(model):
    """The model after torch.save and torch.load; first asserts that the pickle names nothing of
    stowage's, so loading it needs no stowage. weights_only=False: a whole model is a pickle of
    its classes (torch 2.6+ loads weights only by default)."""
    assert b"stowage" not in pickle.dumps(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)
