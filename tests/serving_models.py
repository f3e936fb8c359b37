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


def hf_greedy(model, ids, n):
    """n greedy tokens from Hugging Face on CPU after the token ids `ids`, past the end-of-sequence
    token as the servers' ignore_eos goes on (generate would stop there)."""
    ids = torch.tensor([ids])
    new = []
    with torch.no_grad():
        for _ in range(n):
            nxt = model(ids).logits[0, -1].argmax().item()
            new.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return new


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_openai_server(server, log_path, port, model, tok, prompts):
    """Waits for an OpenAI-compatible server (model name "tiny") on 127.0.0.1:port, then checks,
    with the openai client: a greedy completion equal to Hugging Face's, the same streamed, a
    chat completion, 8 concurrent requests, and a bad request (negative temperature) answered
    with a 400 while the server keeps serving."""
    import concurrent.futures
    import time

    import openai
    import pytest

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=120)
    deadline = time.time() + 300
    while True:
        try:
            client.models.list()
            break
        except openai.APIConnectionError:
            assert server.poll() is None, log_path.read_text()[-4000:]
            assert time.time() < deadline, "the server did not come up"
            time.sleep(1)

    def expected(prompt, n):
        return tok.decode(hf_greedy(model, tok(prompt).input_ids, n)).strip()

    def complete(prompt, n, **kw):
        return client.completions.create(model="tiny", prompt=prompt, max_tokens=n, temperature=0,
                                         extra_body={"ignore_eos": True}, **kw)

    done = complete(prompts[0], 8)
    assert done.choices[0].text.strip() == expected(prompts[0], 8)
    streamed = "".join(c.choices[0].text for c in complete(prompts[0], 8, stream=True))
    assert streamed == done.choices[0].text
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "the cat sat"}],
                                          max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    assert chat.choices[0].message.content is not None and chat.usage.completion_tokens == 6
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = dict(pool.map(lambda i: (i, complete(prompts[i % len(prompts)], 6).choices[0].text), range(8)))
    for i, text in results.items():
        assert text.strip() == expected(prompts[i % len(prompts)], 6), i
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt=prompts[0], max_tokens=4, temperature=-1.0)
    assert client.completions.create(model="tiny", prompt=prompts[0], max_tokens=2).choices[0].text is not None


def serve_and_check(cmd, log_path, port, model, tok, prompts, env=None):
    """Starts a server (`cmd`, listening on 127.0.0.1:port, its output to log_path), runs
    check_openai_server against it, then stops it with SIGTERM (as a supervisor would) and
    checks that it exits."""
    import subprocess

    with open(log_path, "w") as log:
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            check_openai_server(server, log_path, port, model, tok, prompts)
        except Exception as e:
            # What the server printed last says why it stopped answering (or answered wrong).
            state = "running" if server.poll() is None else f"exited with {server.returncode}"
            raise AssertionError(f"{e!r}; the server is {state}; its log ends:\n{log_path.read_text()[-6000:]}") from e
        finally:
            server.terminate()
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                raise AssertionError("the server did not exit within 60 s of SIGTERM")
