"""A copy of a Hugging Face Qwen3 checkpoint with only its first N decoder layers, for rehearsing a large
checkpoint on a host whose memory holds its width and vocabulary but not every layer (docs/first_run.md):

    python -m experiments.cut_checkpoint /path/to/Qwen3-0.6B /path/to/Qwen3-0.6B-2layers --layers 2
"""
from experiments import cli


def main(argv=None):
    p = cli.Parser(prog="experiments.cut_checkpoint", description=cli.summary(__doc__))
    p.add_argument("src", help="the checkpoint directory (config.json, *.safetensors, tokenizer files)")
    p.add_argument("dst", help="the new directory to write (must not exist)")
    p.add_argument("--layers", type=int, required=True, help="decoder layers to keep (the first N)")
    args = p.parse_args(argv)
    from jaxagent.models.weights import cut_layers
    with cli.clear_errors():
        try:
            cfg = cut_layers(args.src, args.dst, args.layers)
        except (ValueError, FileExistsError, FileNotFoundError) as e:
            cli.fail(str(e))
    print(f"{args.dst}: {cfg.num_hidden_layers} of the checkpoint's layers, width {cfg.hidden_size}, "
          f"vocabulary {cfg.vocab_size}")


if __name__ == "__main__":
    main()
