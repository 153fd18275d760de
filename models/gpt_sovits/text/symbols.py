"""The GPT-SoVITS v2 phone vocabulary: 732 symbols, a phone's id is its index in ``SYMBOLS``.

The official v2 checkpoints embed phones by these ids (``phoneme_vocab_size`` 732 in the T2S config,
the text embedding of the SoVITS encoder), so the order below is a fact of the weights, not a choice.
The official list is assembled in three parts, and we rebuild it the same way:

1. the union of the pad, the Mandarin initials, the toned Mandarin finals, the Japanese phones, the
   punctuation and pause symbols, and ARPAbet, sorted by code point (322 symbols, ids 0-321);
2. the Japanese pitch marks ``[`` and ``]`` (ids 322-323);
3. the Korean jamo (and the two pause hanzi of the Korean front end), sorted (ids 324-352), then the
   Cantonese phones, each prefixed ``Y`` so that none collides with a Mandarin one, sorted (353-731).

Only parts of this vocabulary are produced by our front end (Mandarin, English, punctuation); the rest
must still be present so that the ids line up with the checkpoints.
"""
from __future__ import annotations

PAD = "_"
UNKNOWN = "UNK"
# The punctuation the official front ends keep as phones; every other mark is mapped onto these or dropped.
PUNCTUATION = ("!", "?", "…", ",", ".", "-")
PAUSES = ("SP", "SP2", "SP3")

MANDARIN_INITIALS = tuple(
    "AA EE OO b c ch d f g h j k l m n p q r s sh t w x y z zh".split()
)  # AA/EE/OO: the zero initials of syllables spelled with a bare a/e/o
MANDARIN_FINALS = tuple(
    "E En a ai an ang ao e ei en eng er i i0 ia ian iang iao ie in ing iong ir iu "
    "o ong ou u ua uai uan uang ui un uo v van ve vn".split()
)  # i0: the apical vowel after z/c/s; ir: after zh/ch/sh/r; E and En: ye and yan
MANDARIN_TONES = ("1", "2", "3", "4", "5")  # 5 is the neutral tone

JAPANESE_PHONES = tuple(
    "I N U a b by ch cl d dy e f g gy h hy i j k ky m my n ny o p py r ry s sh t ts u v w y z".split()
)
JAPANESE_PITCH_MARKS = ("[", "]")

ARPABET = tuple(
    "AA0 AA1 AA2 AE0 AE1 AE2 AH0 AH1 AH2 AO0 AO1 AO2 AW0 AW1 AW2 AY0 AY1 AY2 B CH D DH "
    "EH0 EH1 EH2 ER ER0 ER1 ER2 EY0 EY1 EY2 F G HH IH IH0 IH1 IH2 IY0 IY1 IY2 JH K L M N NG "
    "OW0 OW1 OW2 OY0 OY1 OY2 P R S SH T TH UH0 UH1 UH2 UW0 UW1 UW2 V W Y Z ZH".split()
)  # with stress digits, as CMUdict writes vowels; the bare ER and IH are in the official set too

KOREAN_SYMBOLS = tuple("ㄱㄴㄷㄹㅁㅂㅅㅇㅈㅊㅋㅌㅍㅎㄲㄸㅃㅆㅉㅏㅓㅗㅜㅡㅣㅐㅔ空停")

# Cantonese (Jyutping pieces with tones 1-6), already in the official sorted order.
CANTONESE_SYMBOLS = tuple(
    """
    Ya Ya1 Ya2 Ya3 Ya4 Ya5 Ya6 Yaa Yaa1 Yaa2 Yaa3 Yaa4 Yaa5 Yaa6 Yaai1 Yaai2 Yaai3 Yaai4 Yaai5 Yaai6
    Yaak1 Yaak2 Yaak3 Yaak4 Yaak5 Yaak6 Yaam1 Yaam2 Yaam3 Yaam4 Yaam5 Yaam6 Yaan1 Yaan2 Yaan3 Yaan4
    Yaan5 Yaan6 Yaang1 Yaang2 Yaang3 Yaang4 Yaang5 Yaang6 Yaap1 Yaap2 Yaap3 Yaap4 Yaap5 Yaap6 Yaat1
    Yaat2 Yaat3 Yaat4 Yaat5 Yaat6 Yaau1 Yaau2 Yaau3 Yaau4 Yaau5 Yaau6 Yai Yai1 Yai2 Yai3 Yai4 Yai5 Yai6
    Yak Yak1 Yak2 Yak3 Yak4 Yak5 Yak6 Yam1 Yam2 Yam3 Yam4 Yam5 Yam6 Yan1 Yan2 Yan3 Yan4 Yan5 Yan6 Yang1
    Yang2 Yang3 Yang4 Yang5 Yang6 Yap1 Yap2 Yap3 Yap4 Yap5 Yap6 Yat1 Yat2 Yat3 Yat4 Yat5 Yat6 Yau Yau1
    Yau2 Yau3 Yau4 Yau5 Yau6 Yb Yc Yd Ye Ye1 Ye2 Ye3 Ye4 Ye5 Ye6 Yei1 Yei2 Yei3 Yei4 Yei5 Yei6 Yek1 Yek2
    Yek3 Yek4 Yek5 Yek6 Yeng1 Yeng2 Yeng3 Yeng4 Yeng5 Yeng6 Yeoi1 Yeoi2 Yeoi3 Yeoi4 Yeoi5 Yeoi6 Yeon1
    Yeon2 Yeon3 Yeon4 Yeon5 Yeon6 Yeot1 Yeot2 Yeot3 Yeot4 Yeot5 Yeot6 Yf Yg Yg1 Yg2 Yg3 Yg4 Yg5 Yg6 Ygw
    Yh Yi1 Yi2 Yi3 Yi4 Yi5 Yi6 Yik1 Yik2 Yik3 Yik4 Yik5 Yik6 Yim1 Yim2 Yim3 Yim4 Yim5 Yim6 Yin1 Yin2
    Yin3 Yin4 Yin5 Yin6 Ying1 Ying2 Ying3 Ying4 Ying5 Ying6 Yip1 Yip2 Yip3 Yip4 Yip5 Yip6 Yit1 Yit2 Yit3
    Yit4 Yit5 Yit6 Yiu1 Yiu2 Yiu3 Yiu4 Yiu5 Yiu6 Yj Yk Yk1 Yk2 Yk3 Yk4 Yk5 Yk6 Ykw Yl Ym Ym1 Ym2 Ym3 Ym4
    Ym5 Ym6 Yn Yn1 Yn2 Yn3 Yn4 Yn5 Yn6 Yng Yo Yo1 Yo2 Yo3 Yo4 Yo5 Yo6 Yoe1 Yoe2 Yoe3 Yoe4 Yoe5 Yoe6
    Yoek1 Yoek2 Yoek3 Yoek4 Yoek5 Yoek6 Yoeng1 Yoeng2 Yoeng3 Yoeng4 Yoeng5 Yoeng6 Yoi Yoi1 Yoi2 Yoi3
    Yoi4 Yoi5 Yoi6 Yok Yok1 Yok2 Yok3 Yok4 Yok5 Yok6 Yon Yon1 Yon2 Yon3 Yon4 Yon5 Yon6 Yong1 Yong2 Yong3
    Yong4 Yong5 Yong6 Yot1 Yot2 Yot3 Yot4 Yot5 Yot6 You You1 You2 You3 You4 You5 You6 Yp Yp1 Yp2 Yp3 Yp4
    Yp5 Yp6 Ys Yt Yt1 Yt2 Yt3 Yt4 Yt5 Yt6 Yu1 Yu2 Yu3 Yu4 Yu5 Yu6 Yui1 Yui2 Yui3 Yui4 Yui5 Yui6 Yuk Yuk1
    Yuk2 Yuk3 Yuk4 Yuk5 Yuk6 Yun1 Yun2 Yun3 Yun4 Yun5 Yun6 Yung1 Yung2 Yung3 Yung4 Yung5 Yung6 Yut1 Yut2
    Yut3 Yut4 Yut5 Yut6 Yw Yyu1 Yyu2 Yyu3 Yyu4 Yyu5 Yyu6 Yyun1 Yyun2 Yyun3 Yyun4 Yyun5 Yyun6 Yyut1 Yyut2
    Yyut3 Yyut4 Yyut5 Yyut6 Yz
    """.split()
)


def _build_symbols() -> tuple[str, ...]:
    toned_finals = [final + tone for tone in MANDARIN_TONES for final in MANDARIN_FINALS]
    first_part = sorted(
        {PAD, *MANDARIN_INITIALS, *toned_finals, *JAPANESE_PHONES, *PUNCTUATION, *PAUSES, UNKNOWN, *ARPABET}
    )
    return (*first_part, *JAPANESE_PITCH_MARKS, *sorted(KOREAN_SYMBOLS), *sorted(CANTONESE_SYMBOLS))


SYMBOLS: tuple[str, ...] = _build_symbols()
SYMBOL_TO_ID: dict[str, int] = {symbol: index for index, symbol in enumerate(SYMBOLS)}
VOCABULARY_SIZE = len(SYMBOLS)


def phones_to_ids(phones: tuple[str, ...] | list[str]) -> tuple[int, ...]:
    """The v2 ids of ``phones``; a phone outside the vocabulary is a front-end bug, so it raises."""
    unknown = sorted({phone for phone in phones if phone not in SYMBOL_TO_ID})
    if unknown:
        raise KeyError(f"phones {unknown} are not GPT-SoVITS v2 symbols (the vocabulary has {VOCABULARY_SIZE})")
    return tuple(SYMBOL_TO_ID[phone] for phone in phones)
