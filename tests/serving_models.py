"""Tiny random Hugging Face checkpoints for the serving tests, saved locally: config, weights
(safetensors) and a tokenizer built with the `tokenizers` package (no download)."""
import torch

WORDS = ["the", "a", "cat", "dog", "sat", "on", "mat", "ran", "to", "house", "big", "small", "red", "blue",
         "and", "then", "it", "was", "very", "happy", "sad", "tree", "under", "over", ".", ","]


def tokenizer():
    """A word-level tokenizer over a small vocabulary (ids 0-2 are <pad>, <s>, </s>)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<pad>", "<s>", "</s>", "<unk>", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # A chat template for the chat endpoints: the turns' texts one after the other.
    template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", chat_template=template)


def save_tiny(name, path, **overrides):
    """Saves a tiny random model of the Hugging Face family `name` ("Llama", "Qwen2", ...)."""
    import transformers

    tok = tokenizer()
    fields = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
                  pad_token_id=0, tie_word_embeddings=name.startswith("Gemma"))  # vLLM's Gemma ties them
    cfg = getattr(transformers, name + "Config")(**{**fields, **overrides})
    torch.manual_seed(0)
    model = getattr(transformers, "AutoModelForCausalLM").from_config(cfg)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return model.eval(), tok
