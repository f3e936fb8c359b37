//! Bessel functions: the modified i0/i0e/i1/i1e (and special_modified_bessel_i0/i1), J0/J1,
//! Y0/Y1, K0/K1 (and scaled K), the spherical j0 and Airy Ai; and kaiser_window, a window of
//! i0 values.
use crate::args::Args;
use crate::blocks::loops::{loop_more, next_count, select_all};
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{check, one, Out, op, Op};
use super::{chbevl, float_unary, float_unary_no16, polevl};
use stablehlo::{ElemType, Ex, TensorType, Value, E};

pub(crate) const OPS: &[Op] = &[
    // Routed: its composites run a kernel stub that only CPU and CUDA register.
    op("kaiser_window", kaiser_window).routed(&["kaiser_window", "kaiser_window.periodic", "kaiser_window.beta"]),
    op("i0", |cx, a| float_unary(cx, a, |cx, x| bessel_i0(cx, x, false))),
    op("special_i0", |cx, a| float_unary(cx, a, |cx, x| bessel_i0(cx, x, false))),
    op("special_i0e", |cx, a| float_unary(cx, a, |cx, x| bessel_i0(cx, x, true))),
    op("special_i1", |cx, a| float_unary(cx, a, |cx, x| bessel_i1(cx, x, false))),
    op("special_i1e", |cx, a| float_unary(cx, a, |cx, x| bessel_i1(cx, x, true))),
    op("special_modified_bessel_i0", |cx, a| {
        float_unary_no16(cx, a, "modified_bessel_i0_cpu", |cx, x| bessel_i0(cx, x, false))
    }),
    op("special_modified_bessel_i1", |cx, a| {
        float_unary_no16(cx, a, "modified_bessel_i1_cpu", |cx, x| bessel_i1(cx, x, false))
    }),
    op("special_bessel_j0", |cx, a| float_unary_no16(cx, a, "bessel_j0_cpu", bessel_j0_values)),
    op("special_bessel_j1", |cx, a| float_unary_no16(cx, a, "bessel_j1_cpu", bessel_j1_values)),
    op("special_bessel_y0", |cx, a| float_unary_no16(cx, a, "bessel_y0_cpu", bessel_y0_values)),
    op("special_bessel_y1", |cx, a| float_unary_no16(cx, a, "bessel_y1_cpu", bessel_y1_values)),
    op("special_modified_bessel_k0", |cx, a| {
        float_unary_no16(cx, a, "modified_bessel_k0_cpu", |cx, x| bessel_k_values(cx, x, false, false))
    }),
    op("special_modified_bessel_k1", |cx, a| {
        float_unary_no16(cx, a, "modified_bessel_k1_cpu", |cx, x| bessel_k_values(cx, x, true, false))
    }),
    op("special_scaled_modified_bessel_k0", |cx, a| {
        float_unary_no16(cx, a, "scaled_modified_bessel_k0_cpu", |cx, x| bessel_k_values(cx, x, false, true))
    }),
    op("special_scaled_modified_bessel_k1", |cx, a| {
        float_unary_no16(cx, a, "scaled_modified_bessel_k1_cpu", |cx, x| bessel_k_values(cx, x, true, true))
    }),
    op("special_spherical_bessel_j0", |cx, a| float_unary_no16(cx, a, "spherical_bessel_j0_cpu", spherical_j0_values)),
    op("special_airy_ai", |cx, a| float_unary_no16(cx, a, "airy_ai_cpu", airy_ai_values)),
];

// ---- Bessel functions ---------------------------------------------------------------------------------

const I0E_A: [f64; 30] = [
    -4.41534164647933937950E-18, 3.33079451882223809783E-17, -2.43127984654795469359E-16, 1.71539128555513303061E-15,
    -1.16853328779934516808E-14, 7.67618549860493561688E-14, -4.85644678311192946090E-13, 2.95505266312963983461E-12,
    -1.72682629144155570723E-11, 9.67580903537323691224E-11, -5.18979560163526290666E-10, 2.65982372468238665035E-9,
    -1.30002500998624804212E-8, 6.04699502254191894932E-8, -2.67079385394061173391E-7, 1.11738753912010371815E-6,
    -4.41673835845875056359E-6, 1.64484480707288970893E-5, -5.75419501008210370398E-5, 1.88502885095841655729E-4,
    -5.76375574538582365885E-4, 1.63947561694133579842E-3, -4.32430999505057594430E-3, 1.05464603945949983183E-2,
    -2.37374148058994688156E-2, 4.93052842396707084878E-2, -9.49010970480476444210E-2, 1.71620901522208775349E-1,
    -3.04682672343198398683E-1, 6.76795274409476084995E-1,
];

const I0E_B: [f64; 25] = [
    -7.23318048787475395456E-18, -4.83050448594418207126E-18, 4.46562142029675999901E-17, 3.46122286769746109310E-17,
    -2.82762398051658348494E-16, -3.42548561967721913462E-16, 1.77256013305652638360E-15, 3.81168066935262242075E-15,
    -9.55484669882830764870E-15, -4.15056934728722208663E-14, 1.54008621752140982691E-14, 3.85277838274214270114E-13,
    7.18012445138366623367E-13, -1.79417853150680611778E-12, -1.32158118404477131188E-11, -3.14991652796324136454E-11,
    1.18891471078464383424E-11, 4.94060238822496958910E-10, 3.39623202570838634515E-9, 2.26666899049817806459E-8,
    2.04891858946906374183E-7, 2.89137052083475648297E-6, 6.88975834691682398426E-5, 3.36911647825569408990E-3,
    8.04490411014108831608E-1,
];

const I1E_A: [f64; 29] = [
    2.77791411276104639959E-18, -2.11142121435816608115E-17, 1.55363195773620046921E-16, -1.10559694773538630805E-15,
    7.60068429473540693410E-15, -5.04218550472791168711E-14, 3.22379336594557470981E-13, -1.98397439776494371520E-12,
    1.17361862988909016308E-11, -6.66348972350202774223E-11, 3.62559028155211703701E-10, -1.88724975172282928790E-9,
    9.38153738649577178388E-9, -4.44505912879632808065E-8, 2.00329475355213526229E-7, -8.56872026469545474066E-7,
    3.47025130813767847674E-6, -1.32731636560394358279E-5, 4.78156510755005422638E-5, -1.61760815825896745588E-4,
    5.12285956168575772895E-4, -1.51357245063125314899E-3, 4.15642294431288815669E-3, -1.05640848946261981558E-2,
    2.47264490306265168283E-2, -5.29459812080949914269E-2, 1.02643658689847095384E-1, -1.76416518357834055153E-1,
    2.52587186443633654823E-1,
];

const I1E_B: [f64; 25] = [
    7.51729631084210481353E-18, 4.41434832307170791151E-18, -4.65030536848935832153E-17, -3.20952592199342395980E-17,
    2.96262899764595013876E-16, 3.30820231092092828324E-16, -1.88035477551078244854E-15, -3.81440307243700780478E-15,
    1.04202769841288027642E-14, 4.27244001671195135429E-14, -2.10154184277266431302E-14, -4.08355111109219731823E-13,
    -7.19855177624590851209E-13, 2.03562854414708950722E-12, 1.41258074366137813316E-11, 3.25260358301548823856E-11,
    -1.89749581235054123450E-11, -5.58974346219658380687E-10, -3.83538038596423702205E-9, -2.63146884688951950684E-8,
    -2.51223623787020892529E-7, -3.88256480887769039346E-6, -1.10588938762623716291E-4, -9.76109749136146840777E-3,
    7.78576235018280120474E-1,
];

/// The two Chebyshev pieces of a Cephes Bessel function: on [0, 8] in y = x/2 - 2 and above
/// in 32/x - 2 (divided by sqrt(x)); `x` is |x|.
fn bessel_pieces<'e>(ax: E<'e>, a: &[f64], b: &[f64]) -> (E<'e>, E<'e>, E<'e>) {
    let near = chbevl(ax * 0.5 - 2.0, a);
    let far = chbevl(32.0 / ax - 2.0, b) / ax.sqrt();
    (ax.le(8.0), near, far)
}

/// i0 (or i0e with `scaled`): even, exp(|x|) times the Chebyshev pieces.
fn bessel_i0(cx: &mut Cx, x: Value, scaled: bool) -> Value {
    i0(Ex::new(cx).of(x), scaled).v
}

fn i0(x: E<'_>, scaled: bool) -> E<'_> {
    let ax = x.abs();
    let (is_near, near, far) = bessel_pieces(ax, &I0E_A, &I0E_B);
    let r = is_near.select(near, far);
    if scaled {
        r
    } else {
        ax.exp() * r
    }
}

/// i1 (or i1e): odd, x times the near piece below 8. PyTorch's float kernels use shortened
/// tables (the last 17 and 7 coefficients).
fn bessel_i1(cx: &mut Cx, x: Value, scaled: bool) -> Value {
    let e = Ex::new(cx);
    let x = e.of(x);
    let double = x.elem() == ElemType::F64;
    let (a, b): (&[f64], &[f64]) = if double { (&I1E_A, &I1E_B) } else { (&I1E_A[12..], &I1E_B[18..]) };
    let ax = x.abs();
    let (is_near, near, far) = bessel_pieces(ax, a, b);
    let r = is_near.select(near * ax, far);
    let r = if scaled { r } else { ax.exp() * r };
    x.lt(0.0).select(-r, r).v
}

// ---- Bessel functions of the first and second kind, K, spherical j0, Airy Ai -----------------------

const J0_PP: [f64; 7] = [
    7.96936729297347051624e-04, 8.28352392107440799803e-02, 1.23953371646414299388e+00, 5.44725003058768775090e+00,
    8.74716500199817011941e+00, 5.30324038235394892183e+00, 9.99999999999999997821e-01,
];
const J0_PQ: [f64; 7] = [
    9.24408810558863637013e-04, 8.56288474354474431428e-02, 1.25352743901058953537e+00, 5.47097740330417105182e+00,
    8.76190883237069594232e+00, 5.30605288235394617618e+00, 1.00000000000000000218e+00,
];
const J0_QP: [f64; 8] = [
    -1.13663838898469149931e-02, -1.28252718670509318512e+00, -1.95539544257735972385e+01, -9.32060152123768231369e+01,
    -1.77681167980488050595e+02, -1.47077505154951170175e+02, -5.14105326766599330220e+01, -6.05014350600728481186e+00,
];
const J0_QQ: [f64; 7] = [
    6.43178256118178023184e+01, 8.56430025976980587198e+02, 3.88240183605401609683e+03, 7.24046774195652478189e+03,
    5.93072701187316984827e+03, 2.06209331660327847417e+03, 2.42005740240291393179e+02,
];
const J0_RP: [f64; 4] = [-4.79443220978201773821e+09, 1.95617491946556577543e+12, -2.49248344360967716204e+14, 9.70862251047306323952e+15];
const J0_RQ: [f64; 8] = [
    4.99563147152651017219e+02, 1.73785401676374683123e+05, 4.84409658339962045305e+07, 1.11855537045356834862e+10,
    2.11277520115489217587e+12, 3.10518229857422583814e+14, 3.18121955943204943306e+16, 1.71086294081043136091e+18,
];
const Y0_YP: [f64; 8] = [
    1.55924367855235737965e+04, -1.46639295903971606143e+07, 5.43526477051876500413e+09, -9.82136065717911466409e+11,
    8.75906394395366999549e+13, -3.46628303384729719441e+15, 4.42733268572569800351e+16, -1.84950800436986690637e+16,
];
const Y0_YQ: [f64; 7] = [
    1.04128353664259848412e+03, 6.26107330137134956842e+05, 2.68919633393814121987e+08, 8.64002487103935000337e+10,
    2.02979612750105546709e+13, 3.17157752842975028269e+15, 2.50596256172653059228e+17,
];
const J1_PP: [f64; 7] = [
    7.62125616208173112003e-04, 7.31397056940917570436e-02, 1.12719608129684925192e+00, 5.11207951146807644818e+00,
    8.42404590141772420927e+00, 5.21451598682361504063e+00, 1.00000000000000000254e+00,
];
const J1_PQ: [f64; 7] = [
    5.71323128072548699714e-04, 6.88455908754495404082e-02, 1.10514232634061696926e+00, 5.07386386128601488557e+00,
    8.39985554327604159757e+00, 5.20982848682361821619e+00, 9.99999999999999997461e-01,
];
const J1_QP: [f64; 8] = [
    5.10862594750176621635e-02, 4.98213872951233449420e+00, 7.58238284132545283818e+01, 3.66779609360150777800e+02,
    7.10856304998926107277e+02, 5.97489612400613639965e+02, 2.11688757100572135698e+02, 2.52070205858023719784e+01,
];
const J1_QQ: [f64; 7] = [
    7.42373277035675149943e+01, 1.05644886038262816351e+03, 4.98641058337653607651e+03, 9.56231892404756170795e+03,
    7.99704160447350683650e+03, 2.82619278517639096600e+03, 3.36093607810698293419e+02,
];
const J1_RP: [f64; 4] = [-8.99971225705559398224e+08, 4.52228297998194034323e+11, -7.27494245221818276015e+13, 3.68295732863852883286e+15];
const J1_RQ: [f64; 8] = [
    6.20836478118054335476e+02, 2.56987256757748830383e+05, 8.35146791431949253037e+07, 2.21511595479792499675e+10,
    4.74914122079991414898e+12, 7.84369607876235854894e+14, 8.95222336184627338078e+16, 5.32278620332680085395e+18,
];
const Y1_YP: [f64; 6] = [
    1.26320474790178026440e+09, -6.47355876379160291031e+11, 1.14509511541823727583e+14, -8.12770255501325109621e+15,
    2.02439475713594898196e+17, -7.78877196265950026825e+17,
];
const Y1_YQ: [f64; 8] = [
    5.94301592346128195359e+02, 2.35564092943068577943e+05, 7.34811944459721705660e+07, 1.87601316108706159478e+10,
    3.88231277496238566008e+12, 6.20557727146953693363e+14, 6.87141087355300489866e+16, 3.97270608116560655612e+18,
];
const K0_A: [f64; 10] = [
    1.37446543561352307156e-16, 4.25981614279661018399e-14, 1.03496952576338420167e-11, 1.90451637722020886025e-09,
    2.53479107902614945675e-07, 2.28621210311945178607e-05, 1.26461541144692592338e-03, 3.59799365153615016266e-02,
    3.44289899924628486886e-01, -5.35327393233902768720e-01,
];
const K0_B: [f64; 25] = [
    5.30043377268626276149e-18, -1.64758043015242134646e-17, 5.21039150503902756861e-17, -1.67823109680541210385e-16,
    5.51205597852431940784e-16, -1.84859337734377901440e-15, 6.34007647740507060557e-15, -2.22751332699166985548e-14,
    8.03289077536357521100e-14, -2.98009692317273043925e-13, 1.14034058820847496303e-12, -4.51459788337394416547e-12,
    1.85594911495471785253e-11, -7.95748924447710747776e-11, 3.57739728140030116597e-10, -1.69753450938905987466e-09,
    8.57403401741422608519e-09, -4.66048989768794782956e-08, 2.76681363944501510342e-07, -1.83175552271911948767e-06,
    1.39498137188764993662e-05, -1.28495495816278026384e-04, 1.56988388573005337491e-03, -3.14481013119645005427e-02,
    2.44030308206595545468e+00,
];
const K1_A: [f64; 11] = [
    -7.02386347938628759343e-18, -2.42744985051936593393e-15, -6.66690169419932900609e-13, -1.41148839263352776110e-10,
    -2.21338763073472585583e-08, -2.43340614156596823496e-06, -1.73028895751305206302e-04, -6.97572385963986435018e-03,
    -1.22611180822657148235e-01, -3.53155960776544875667e-01, 1.52530022733894777053e+00,
];
const K1_B: [f64; 25] = [
    -5.75674448366501715755e-18, 1.79405087314755922667e-17, -5.68946255844285935196e-17, 1.83809354436663880070e-16,
    -6.05704724837331885336e-16, 2.03870316562433424052e-15, -7.01983709041831346144e-15, 2.47715442448130437068e-14,
    -8.97670518232499435011e-14, 3.34841966607842919884e-13, -1.28917396095102890680e-12, 5.13963967348173025100e-12,
    -2.12996783842756842877e-11, 9.21831518760500529508e-11, -4.19035475934189648750e-10, 2.01504975519703286596e-09,
    -1.03457624656780970260e-08, 5.74108412545004946722e-08, -3.50196060308781257119e-07, 2.40648494783721712015e-06,
    -1.93619797416608296024e-05, 1.95215518471351631108e-04, -2.85781685962277938680e-03, 1.03923736576817238437e-01,
    2.72062619048444266945e+00,
];
const AIRY_AN: [f64; 8] = [
    3.46538101525629032477e-01, 1.20075952739645805542e+01, 7.62796053615234516538e+01, 1.68089224934630576269e+02,
    1.59756391350164413639e+02, 7.05360906840444183113e+01, 1.40264691163389668864e+01, 9.99999999999999995305e-01,
];
const AIRY_AD: [f64; 8] = [
    5.67594532638770212846e-01, 1.47562562584847203173e+01, 8.45138970141474626562e+01, 1.77318088145400459522e+02,
    1.64234692871529701831e+02, 7.14778400825575695274e+01, 1.40959135607834029598e+01, 1.00000000000000000470e+00,
];
const AIRY_AFN: [f64; 9] = [
    -1.31696323418331795333e-01, -6.26456544431912369773e-01, -6.93158036036933542233e-01, -2.79779981545119124951e-01,
    -4.91900132609500318020e-02, -4.06265923594885404393e-03, -1.59276496239262096340e-04, -2.77649108155232920844e-06,
    -1.67787698489114633780e-08,
];
const AIRY_AFD: [f64; 9] = [
    1.33560420706553243746e+01, 3.26825032795224613948e+01, 2.67367040941499554804e+01, 9.18707402907259625840e+00,
    1.47529146771666414581e+00, 1.15687173795188044134e-01, 4.40291641615211203805e-03, 7.54720348287414296618e-05,
    4.51850092970580378464e-07,
];
const AIRY_AGN: [f64; 11] = [
    1.97339932091685679179e-02, 3.91103029615688277255e-01, 1.06579897599595591108e+00, 9.39169229816650230044e-01,
    3.51465656105547619242e-01, 6.33888919628925490927e-02, 5.85804113048388458567e-03, 2.82851600836737019778e-04,
    6.98793669997260967291e-06, 8.11789239554389293311e-08, 3.41551784765923618484e-10,
];
const AIRY_AGD: [f64; 10] = [
    9.30892908077441974853e+00, 1.98352928718312140417e+01, 1.55646628932864612953e+01, 5.47686069422975497931e+00,
    9.54293611618961883998e-01, 8.64580826352392193095e-02, 4.12656523824222607191e-03, 1.01259085116509135510e-04,
    1.17166733214413521882e-06, 4.91834570062930015649e-09,
];

/// sqrt(2/pi), the factor of the asymptotic forms of J and Y.
const SQRT_2_OVER_PI: f64 = 0.797884560802865355879892119868763737;
const TWO_OVER_PI: f64 = 0.636619772367581343075535053490057448;

/// The asymptotic form of J0/Y0 (`first` for J) or J1/Y1 beyond 5, for x > 0:
/// (P cos(x - phase) - 5/x Q sin(x - phase)) sqrt(2/pi) / sqrt(x) for J, with sin and cos
/// swapped and a plus for Y.
fn bessel_far(x: E<'_>, order1: bool, first: bool) -> E<'_> {
    let z = if order1 {
        // (5/x) (5/x)
        let f = 5.0 / x;
        f * f
    } else {
        // 25 / (x x)
        25.0 / (x * x)
    };
    let (pp, pq, qp, qq): (&[f64], &[f64], &[f64], &[f64]) =
        if order1 { (&J1_PP, &J1_PQ, &J1_QP, &J1_QQ) } else { (&J0_PP, &J0_PQ, &J0_QP, &J0_QQ) };
    let (pp, pq, qp, qq) = (polevl(z, pp), polevl(z, pq), polevl(z, qp), polevl(z, qq));
    let phase = if order1 { 2.356194490192344928846982537459627163 } else { 0.785398163397448309615660845819875721 };
    let s = x - phase;
    let (c1, c2) = if first { (s.cos(), s.sin()) } else { (s.sin(), s.cos()) };
    let a = pp / pq * c1;
    let b = 5.0 / x * (qp / qq) * c2;
    let t = if first { a - b } else { a + b };
    t * SQRT_2_OVER_PI / x.sqrt()
}

fn bessel_j0_values(cx: &mut Cx, x: Value) -> Value {
    j0(Ex::new(cx).of(x)).v
}

/// J0 (Cephes j0): even; 1 - x^2/4 below 1e-5, the rational form up to 5, asymptotic above.
fn j0(x: E<'_>) -> E<'_> {
    let ax = x.abs();
    let xx = ax * ax;
    let tiny_v = 1.0 - xx / 4.0;
    let (rp, rq) = (polevl(xx, &J0_RP), polevl(xx, &J0_RQ));
    let near = (xx - 5.78318596294678452118e+00) * (xx - 3.04712623436620863991e+01) * rp / rq;
    let far = bessel_far(ax, false, true);
    let near = ax.lt(0.00001).select(tiny_v, near);
    ax.le(5.0).select(near, far)
}

fn bessel_j1_values(cx: &mut Cx, x: Value) -> Value {
    j1(Ex::new(cx).of(x)).v
}

/// J1 (Cephes j1): odd; the rational form up to 5, asymptotic above.
fn j1(x: E<'_>) -> E<'_> {
    let ax = x.abs();
    // The rational form is odd in x: evaluate it at x itself, as -J1(-x) gives the same.
    let xx = x * x;
    let (rp, rq) = (polevl(xx, &J1_RP), polevl(xx, &J1_RQ));
    let near = rp / rq * x * (xx - 1.46819706421238932572e+01) * (xx - 4.92184563216946036703e+01);
    let far = bessel_far(ax, true, true);
    let far = x.lt(0.0).select(-far, far);
    ax.le(5.0).select(near, far)
}

/// Y0 (Cephes y0): -inf at 0, NaN below, the rational form plus (2/pi) log(x) J0(x) up to 5.
fn bessel_y0_values(cx: &mut Cx, x: Value) -> Value {
    let e = Ex::new(cx);
    let x = e.of(x);
    let xx = x * x;
    let near = polevl(xx, &Y0_YP) / polevl(xx, &Y0_YQ) + TWO_OVER_PI * x.ln() * j0(x);
    y_edges(x, near, bessel_far(x, false, false), x.lt(0.0)).v
}

/// Y1 (Cephes y1): -inf at 0, NaN below, x R(x^2) + (2/pi)(J1(x) log(x) - 1/x) up to 5.
fn bessel_y1_values(cx: &mut Cx, x: Value) -> Value {
    let e = Ex::new(cx);
    let x = e.of(x);
    let xx = x * x;
    let r = x * (polevl(xx, &Y1_YP) / polevl(xx, &Y1_YQ));
    let near = r + TWO_OVER_PI * (j1(x) * x.ln() - 1.0 / x);
    y_edges(x, near, bessel_far(x, true, false), x.le(0.0)).v
}

/// The branches of Y0/Y1: up to 5 `near` (-inf at 0, NaN where `bad`), above `far`.
fn y_edges<'e>(x: E<'e>, near: E<'e>, far: E<'e>, bad: E<'e>) -> E<'e> {
    let near = bad.select(f64::NAN, near);
    let near = x.eq(0.0).select(f64::NEG_INFINITY, near);
    x.le(5.0).select(near, far)
}

/// PyTorch's modified_bessel_i1_forward (full Chebyshev tables in every dtype) for x in (0, 8]:
/// 0.5 (a - p) x exp(x).
fn i1_near(x: E<'_>) -> E<'_> {
    chbevl(x * 0.5 - 2.0, &I1E_A) * x * x.exp()
}

/// K0 or K1 (`order1`), times exp(x) when `scaled` (Cephes k0/k1/k0e/k1e as PyTorch writes
/// them): inf at 0, NaN below; Chebyshev series in x^2 - 2 with the log(x/2) I term up to 2,
/// in 8/x - 2 above.
fn bessel_k_values(cx: &mut Cx, x: Value, order1: bool, scaled: bool) -> Value {
    let e = Ex::new(cx);
    let x = e.of(x);
    let y = x * x - 2.0;
    let l = (0.5 * x).ln();
    let near = if order1 {
        let a = chbevl(y, &K1_A);
        l * i1_near(x) + a / x
    } else {
        let a = chbevl(y, &K0_A);
        a - l * i0(x, false)
    };
    let near = if scaled { near * x.exp() } else { near };
    let b = chbevl(8.0 / x - 2.0, if order1 { &K1_B } else { &K0_B });
    let b = if scaled { b } else { (-x).exp() * b };
    let far = b / x.sqrt();
    let r = x.le(2.0).select(near, far);
    let r = x.lt(0.0).select(f64::NAN, r);
    x.eq(0.0).select(f64::INFINITY, r).v
}

/// The spherical Bessel function j0 = sin(x)/x: 0 at +-inf, a Taylor polynomial below 0.5.
fn spherical_j0_values(cx: &mut Cx, x: Value) -> Value {
    let e = Ex::new(cx);
    let x = e.of(x);
    let f32_ = x.elem() != ElemType::F64;
    // PyTorch writes the coefficients as T(-1.0) / T(6.0) and so on: quotients rounded in T.
    let coef = |d: f64, sign: f64| {
        let q = if f32_ { (1.0f32 / d as f32) as f64 } else { 1.0 / d };
        sign * q
    };
    let xx = x * x;
    let dens = [6227020800.0, 39916800.0, 362880.0, 5040.0, 120.0, 6.0];
    let mut acc = x.k(coef(dens[0], 1.0));
    let mut sign = -1.0;
    for &d in &dens[1..] {
        acc = coef(d, sign) + xx * acc;
        sign = -sign;
    }
    let small = 1.0 + xx * acc;
    let big = x.sin() / x;
    let ax = x.abs();
    let r = ax.lt(0.5).select(small, big);
    ax.eq(f64::INFINITY).select(0.0, r).v
}

/// Airy Ai (Cephes airy as PyTorch writes it): NaN at +-inf, 0 above 103.892, the asymptotic
/// forms below -2.09 and from 2.09, and in between the Maclaurin series f(x) and g(x), summed
/// (one while loop for the tensor) until each term is below epsilon relative to f.
fn airy_ai_values(cx: &mut Cx, x: Value) -> Value {
    let e = Ex::new(cx);
    let x = e.of(x);
    let double = x.elem() == ElemType::F64;
    let eps = if double { f64::EPSILON } else { f32::EPSILON as f64 };
    let c_ai = 5.64189583547756286948e-01;
    // x < -2.09: with w = -2 x sqrt(-x) / 3 and z = 1/w.
    let sn = (-x).sqrt();
    let w = -2.0 * x * sn / 3.0;
    let z = 1.0 / w;
    let zz = z * z;
    let (afn, afd) = (polevl(zz, &AIRY_AFN), polevl(zz, &AIRY_AFD));
    let (agn, agd) = (polevl(zz, &AIRY_AGN), polevl(zz, &AIRY_AGD));
    let t = w + if double { 0.25 * std::f64::consts::PI } else { 0.25 * (std::f32::consts::PI as f64) };
    let lead = c_ai / sn.sqrt();
    let f = t.sin() * (1.0 + zz * afn / afd);
    let g = t.cos() * (z * agn / agd);
    let neg_v = lead * (f - g);
    // x >= 2.09: zeta = 2 x sqrt(x) / 3.
    let sx = x.sqrt();
    let zeta = 2.0 * x * sx / 3.0;
    let iz = 1.0 / zeta;
    let r = c_ai * (polevl(iz, &AIRY_AN) / polevl(iz, &AIRY_AD));
    let pos_v = r / (2.0 * sx.sqrt() * zeta.exp());
    // In between: f = sum z^k / (3k)! * (1 4 ... (3k-2)), g likewise, with z = x^3.
    let below = x.lt(-2.09);
    let above = x.ge(2.09);
    let series = !(below | above);
    let z3 = (x * x * x).v;
    let one_ = x.k(1.0).v;
    let zero_i = e.with(|b| b.constant_i64(0, ElemType::I64));
    let s = e.with(|b| {
        b.while_loop(
            &[zero_i, one_, x.v, one_, x.v, series.v],
            |b, v| loop_more(b, v[0], v[5], 1000),
            |b, v| {
                let e = Ex::new(b);
                let [j, m, n, f, g, active] = e.all([v[0], v[1], v[2], v[3], v[4], v[5]]);
                let z3 = e.of(z3);
                // k runs 1 + 3j before this step: the divisors are 3j + 2, 3j + 3, 3j + 4.
                let j3 = j * 3i64;
                let kv = [2i64, 3, 4].map(|c| (j3 + c).cast(m.elem()).splat(&m.dims()));
                let m1 = m * z3 / kv[0];
                let n1 = n * z3 / kv[1];
                let m1 = m1 / kv[1];
                let f1 = f + m1;
                let n1 = n1 / kv[2];
                let g1 = g + n1;
                let go_on = (m1 / f1).abs().gt(eps);
                let st = e.with(|b| select_all(b, active.v, &[m1.v, n1.v, f1.v, g1.v], &[m.v, n.v, f.v, g.v]));
                let active = active & go_on;
                let j = e.with(|b| next_count(b, j.v));
                vec![j, st[0], st[1], st[2], st[3], active.v]
            },
        )
    });
    let mid = 0.355028053887817239260 * e.of(s[3]) - 0.258819403792806798405 * e.of(s[4]);
    let r = above.select(pos_v, mid);
    let r = below.select(neg_v, r);
    let r = x.gt(103.892).select(0.0, r);
    x.abs().eq(f64::INFINITY).select(f64::NAN, r).v
}

// ---- kaiser_window ------------------------------------------------------------------------------------

/// kaiser_window(window_length, periodic, beta, dtype): i0(beta sqrt(1 - ((k - a) / a)^2)) /
/// i0(beta) with a = (N - 1) / 2 over N = window_length (+ 1 when periodic, the last dropped),
/// in f32 for 16-bit dtypes. Routed: PyTorch's composite runs a CPU-only kernel stub.
fn kaiser_window(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let n = args.int("window_length")?;
    let periodic = args.bool_or("periodic", true)?;
    let dt = args.dtype("dtype")?.unwrap_or(DType::F32);
    check!(
        dt.is_float(),
        Runtime,
        "kaiser_window expects floating point dtypes, got: TensorOptions(dtype={})",
        dt.torch_name()
    );
    check!(n >= 0, Runtime, "kaiser_window requires non-negative window length, got window_length={}", n);
    if n <= 1 {
        return one(cx.full(1.0, dt, &[n]));
    }
    let len = if periodic { n + 1 } else { n };
    let acc = dt.opmath();
    let beta = match args.opt_scalar("beta")? {
        Some(s) => cx.scalar_like(s, acc, &[n]),
        None => cx.full(12.0, acc, &[n]),
    };
    let k = cx.iota(&TensorType { elem: acc.elem(), dims: vec![n] }, 0);
    // PyTorch's kernel gets arange's values in the window's dtype.
    let k = crate::blocks::round16::round_to(cx, k, dt);
    let alpha = cx.full((len - 1) as f64 / 2.0, acc, &[n]);
    let e = Ex::new(cx);
    let [k, alpha, beta] = e.all([k, alpha, beta]);
    let r = (k - alpha) / alpha;
    let t = beta * (1.0 - r * r).sqrt();
    let w = (i0(t, false) / i0(beta, false)).v;
    one(cx.cast(w, dt))
}
