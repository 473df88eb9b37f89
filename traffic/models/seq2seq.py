"""An LSTM encoder-decoder with attention shaped like Sockeye's RNN models (P3 §5): ``sockeye_lstm``."""

from __future__ import annotations

import torch
from torch import nn

from traffic.models.base import LayeredModel, register_model

SRC_VOCAB = 50_000  # source vocabulary (Sockeye's default --num-words)
TGT_VOCAB = 30_000  # target vocabulary = native num_classes
EMBED = 512  # word embedding size (Sockeye's default --num-embed)
HIDDEN = 1024  # encoder output (2 x 512, bidirectional) and decoder LSTM size (--rnn-num-hidden)
ATT_HIDDEN = 512  # attentional hidden state fed to the output layer
SEQ_LEN = 50  # native sentence length (tokens; Sockeye buckets sentences up to --max-seq-len 100)


class Encoder(nn.Module):
    """Bidirectional LSTM: ``(batch, seq, embed)`` -> ``(batch, seq, hidden)`` (both directions concatenated)."""

    def __init__(self, embed: int, hidden: int):
        super().__init__()
        self.lstm = nn.LSTM(embed, hidden // 2, batch_first=True, bidirectional=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(x)[0]


class AttentionDecoder(nn.Module):
    """LSTM decoder with dot-product attention over the encoder states, one step per source position.

    ``(batch, seq, hidden)`` encoder states ``H`` -> decoder states ``S = LSTM(H)``, attention
    ``A = softmax(S H^T / sqrt(hidden))`` over the source positions, context ``C = A H``, and
    the attentional hidden state ``tanh(W [S; C])`` ``(batch, seq, att_hidden)`` (Luong et al.'s
    "global attention", which Sockeye also offers).
    """

    def __init__(self, hidden: int, att_hidden: int):
        super().__init__()
        self.lstm = nn.LSTM(hidden, hidden, batch_first=True)
        self.combine = nn.Linear(2 * hidden, att_hidden)
        self.scale = hidden**-0.5

    def forward(self, enc: torch.Tensor) -> torch.Tensor:
        dec = self.lstm(enc)[0]
        att = torch.softmax(torch.bmm(dec, enc.transpose(1, 2)) * self.scale, dim=-1)
        ctx = torch.bmm(att, enc)
        return torch.tanh(self.combine(torch.cat([dec, ctx], dim=-1)))


@register_model(
    "sockeye_lstm", input_shape=(SEQ_LEN,), num_classes=TGT_VOCAB, input_dtype=torch.long, input_high=SRC_VOCAB
)
def sockeye_lstm(input_shape: tuple[int, ...], num_classes: int) -> LayeredModel:
    """Sockeye-like LSTM sequence-to-sequence model, heaviest layer first: 54,638,384 parameters.

    P3 §5 trains Sockeye (Hieber et al. 2017), an LSTM-based translation model, and notes
    that "unlike image classification models, the heaviest layer in this model is the
    initial layer"; the paper gives no sizes. Chosen here (Sockeye's RNN defaults where it
    has them):

    - source vocabulary 50,000 (``--num-words``), embedding 512 (``--num-embed``);
    - encoder: one bidirectional LSTM layer, 512 per direction (1,024 outputs);
    - decoder: one LSTM layer of 1,024 (``--rnn-num-hidden``) with dot-product attention and
      a 512-wide attentional hidden state;
    - target vocabulary 30,000 (``num_classes``): smaller than the source side (a
      morphologically poorer target language, e.g. De->En), so the source embedding (25.6M)
      stays the heaviest layer, ahead of the output layer (15.4M);
    - sentence length 50 tokens.

    Input: ``(batch, seq_len)`` ``torch.long`` source token ids in ``[0, 50000)`` (the native
    ``input_shape`` is ``(50,)``, ``input_dtype`` ``torch.long``; any length works).
    Output: ``(batch, seq_len, num_classes)`` logits, one target token per source position
    (the decoder runs over the source positions, without target-side teacher forcing, so
    the forward is a sequence of layers taking one tensor). Loss: cross-entropy over the
    flattened ``batch * seq_len`` tokens against ``(batch, seq_len)`` targets
    (:meth:`LayeredModel.loss`).

    Layers (4; no CONV/FC boundary, ``split_index = None``):

    ====  ===========  ============================================  ==========
    0     ``embed``     Embedding 50000 x 512                         25,600,000
    1     ``encoder``   bi-LSTM 512 -> 2 x 512                         4,202,496
    2     ``decoder``   LSTM 1024 -> 1024, attention, Linear 2048->512  9,445,888
    3     ``output``    Linear 512 -> 30000                           15,390,000
    ====  ===========  ============================================  ==========
    """
    layers = [
        nn.Embedding(SRC_VOCAB, EMBED),
        Encoder(EMBED, HIDDEN),
        AttentionDecoder(HIDDEN, ATT_HIDDEN),
        nn.Linear(ATT_HIDDEN, num_classes),
    ]
    return LayeredModel(
        layers, name="sockeye_lstm", split_index=None, layer_names=["embed", "encoder", "decoder", "output"]
    )
