// compactd's token estimate against three real tokenizers, by kind of text: OpenAI's o200k and
// cl100k, and Anthropic's published one (an older Claude's: the newer models' counts are only
// given by their API). Where the estimate counts fewer tokens than a model, a context that fits
// by the estimate can pass the model's window.
//
//     npm install --prefix /tmp/tok gpt-tokenizer@2.9.0 @anthropic-ai/tokenizer@0.0.4
//     NODE_PATH=/tmp/tok/node_modules node scripts/estimate-vs-tokenizers.mjs
//
// "spec" is the spec's four characters a token; "compactd" counts a digit as two characters,
// two more where a digit follows a letter or a letter a digit, two more where a letter or a
// digit follows ASCII punctuation, four more where a capital follows a small letter, an
// accented Latin or a Cyrillic letter as two, any other outside ASCII as four
// (src/compaction/estimate.rs). FILES=a,b adds files of your own, each as one text.
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const { encode: o200k } = require('gpt-tokenizer/cjs/encoding/o200k_base');
const { encode: cl100k } = require('gpt-tokenizer/cjs/encoding/cl100k_base');
const { countTokens: claude } = require('@anthropic-ai/tokenizer');

const TWO = [[0x80, 0x24f], [0x300, 0x36f], [0x400, 0x52f]];
const charCount = (c) => {
  const code = c.codePointAt(0);
  if (/[0-9]/.test(c)) return 2;
  if (code < 0x80) return 1;
  return TWO.some(([a, b]) => code >= a && code <= b) ? 2 : 4;
};
const kind = (c) => (/[0-9]/.test(c) ? 'digit' : /[a-z]/.test(c) ? 'small'
  : /[A-Z]/.test(c) ? 'capital' : /[!-/:-@[-`{-~]/.test(c) ? 'punctuation' : null);
const alnum = (k) => k === 'digit' || k === 'small' || k === 'capital';
const letter = (k) => k === 'small' || k === 'capital';
const chars = (text) => [...text].length;
const compactd = (text) => {
  let counted = 0;
  let last = null;
  for (const c of text) {
    const k = kind(c);
    const switched = (k === 'digit' && letter(last)) || (letter(k) && last === 'digit');
    counted += charCount(c) + (switched ? 2 : 0)
      + (alnum(k) && last === 'punctuation' ? 2 : 0)
      + (k === 'capital' && last === 'small' ? 4 : 0);
    last = k;
  }
  return Math.ceil(counted / 4);
};

const lines = (n, line) => Array.from({ length: n }, (_, i) => line(i)).join('\n');
const pick = (list, i) => list[i % list.length];
const samples = {
  'English prose': lines(200, (i) => pick([
    'The parser fails on the third fixture because the header is read twice.',
    'We keep the public interface unchanged and add a flag for the old format.',
    'Run the unit tests again after the change, then the integration suite.',
  ], i) + ` (step ${i})`),
  'Rust code': lines(200, (i) => pick([
    `    let value_${i} = config.get("key_${i}").unwrap_or_default();`,
    `    if value_${i}.len() > ${i} { return Err(Error::TooLong(${i})); }`,
    `fn handle_${i}(req: &Request) -> Result<Response, Error> {`,
  ], i)),
  'Japanese prose': lines(200, (i) => `${i}行目：` + pick([
    '設定ファイルを読み込んで、接続先のサーバーを確認しました。',
    '関数の戻り値が期待と異なるため、テストが失敗しています。',
    '利用者の指示に従い、古い形式の読み込みも残します。',
  ], i)),
  'Chinese prose': lines(200, (i) => `第${i}行：` + pick([
    '请读取配置文件并确认服务器的地址。',
    '函数的返回值与预期不同，所以测试失败了。',
    '按照用户的要求，保留旧格式的读取。',
  ], i)),
  'Korean prose': lines(200, (i) => `${i}번째 줄: ` + pick([
    '설정 파일을 읽고 서버 주소를 확인했습니다.',
    '함수의 반환 값이 예상과 달라서 테스트가 실패합니다.',
    '사용자의 지시에 따라 이전 형식도 유지합니다.',
  ], i)),
  'Russian prose': lines(200, (i) => `Строка ${i}: ` + pick([
    'Прочитайте файл конфигурации и проверьте адрес сервера.',
    'Функция возвращает не то значение, поэтому тест падает.',
    'По просьбе пользователя оставляем чтение старого формата.',
  ], i)),
  'Greek prose': lines(200, (i) => `Γραμμή ${i}: ` + pick([
    'Διάβασε το αρχείο ρυθμίσεων και έλεγξε τη διεύθυνση του διακομιστή.',
    'Η συνάρτηση επιστρέφει λάθος τιμή, γι\' αυτό αποτυγχάνει το τεστ.',
  ], i)),
  'Arabic prose': lines(200, (i) => `السطر ${i}: ` + pick([
    'اقرأ ملف الإعدادات وتحقق من عنوان الخادم.',
    'الدالة تعيد قيمة خاطئة، لذلك يفشل الاختبار.',
  ], i)),
  'Hindi prose': lines(200, (i) => `पंक्ति ${i}: ` + pick([
    'कॉन्फ़िगरेशन फ़ाइल पढ़ें और सर्वर का पता जाँचें।',
    'फ़ंक्शन गलत मान लौटाता है, इसलिए परीक्षण विफल होता है।',
  ], i)),
  'Thai prose': lines(200, (i) => `บรรทัด ${i}: ` + pick([
    'อ่านไฟล์การตั้งค่าและตรวจสอบที่อยู่ของเซิร์ฟเวอร์',
    'ฟังก์ชันคืนค่าผิด การทดสอบจึงล้มเหลว',
  ], i)),
  'Vietnamese prose': lines(200, (i) => `Dòng ${i}: ` + pick([
    'Hãy đọc tệp cấu hình và kiểm tra địa chỉ máy chủ.',
    'Hàm trả về giá trị sai nên bài kiểm tra thất bại.',
  ], i)),
  'French prose': lines(200, (i) => `Ligne ${i} : ` + pick([
    'Lisez le fichier de configuration et vérifiez l’adresse du serveur.',
    'La fonction renvoie une valeur erronée, donc le test échoue.',
  ], i)),
  'numbered lines, arrows': lines(200, (i) => `${String(i + 1).padStart(6)}→    let total = total + item.price; // ✓`),
  'git log (SHA-1s)': lines(200, (i) => `commit ${createHash('sha1').update(String(i)).digest('hex')}`),
  'lockfile (checksums)': lines(100, (i) => `[[package]]\nname = "crate-${i}"\nversion = "${i % 3}.${i % 17}.${i % 5}"\n`
    + `checksum = "${createHash('sha256').update(String(i)).digest('hex')}"\n`),
  'UUIDs': lines(200, () => randomUUID()),
  'base64': lines(100, () => randomBytes(60).toString('base64')),
  'numbers (CSV)': lines(200, (i) => [i, i * 37 % 1000, (i * 3.14159).toFixed(4), i * 12345].join(',')),
  'minified code': lines(60, (i) => `function ${pick(['t', 'eA', 'Qn'], i)}(e,n){var r=e.${pick(['getState', 'props', 'ref'], i)}`
    + `(n),o=[${i},${i * 7}];return r?n.${pick(['push', 'setIn', 'map'], i)}(o,!0):void 0},`
    + `${pick(['xe', 'Ot', 'k'], i)}=function(e){return e&&e.__esModule?e:{default:e}};`),
  'SVG path': lines(60, (i) => `<path fill="#${createHash('md5').update(String(i)).digest('hex').slice(0, 6)}" d="M${i}.5,${i * 3}.2c1.1,0,2.2,0.1,3.3,0.3`
    + `c-${i % 9}.6,1.6-4.6,3.4-5.9,5.4v39h-18.3V${i}.7z"/>`),
};
const fs = require('node:fs');
for (const file of (process.env.FILES || '').split(',').filter(Boolean)) {
  samples[file.split('/').pop()] = fs.readFileSync(file, 'utf8');
}

const pad = (s, n) => String(s).padStart(n);
console.log('| text | characters | spec | compactd | o200k | cl100k | Claude (published) | most per compactd token |');
console.log('|---|---:|---:|---:|---:|---:|---:|---:|');
for (const [kind, text] of Object.entries(samples)) {
  const counts = [o200k(text).length, cl100k(text).length, claude(text)];
  const est = compactd(text);
  console.log(`| ${kind} | ${pad(chars(text), 6)} | ${pad(Math.ceil(chars(text) / 4), 6)} | ${pad(est, 6)} | `
    + `${counts.map((c) => pad(c, 6)).join(' | ')} | ${(Math.max(...counts) / est).toFixed(2)} |`);
}
