# ruff: noqa: E501
"""Writes ``accuracy_corpus.txt`` and ``accuracy_queries.txt`` into ``bertfast/data/``.

The accuracy contract (``bertfast.bench.accuracy``) compares sentence vectors of
low-precision variants with bertfast fp32 on the shipped corpus; the files it reads
are the output of this script, which is kept in the repository (not in the package:
an install ships the corpus, not its generator) so the corpus can be regenerated or
extended: ``python tools/make_accuracy_corpus.py`` (tests/test_corpus.py checks that
the shipped files are its output).

Everything below was written for this corpus. Hand-written sentences make up most
of it; a seeded generator adds numbers, dates, prices, log lines and code blocks from
templates (each template is used a few times with different values), and long
paragraphs reach 200-256 WordPiece tokens. The output is shuffled with a fixed seed.
The first ``len(PAIRS)`` queries are paraphrases of corpus sentences (their pair).
"""

from __future__ import annotations

import random
from pathlib import Path

#: where the package's data lives (the repository's bertfast/data, next to tools/)
DATA = Path(__file__).resolve().parents[1] / "bertfast" / "data"

# ---------------------------------------------------------------- paired sentences
# (corpus sentence, query that paraphrases it): the retrieval queries.
PAIRS = [
    (
        "The train to Hamburg was delayed by forty minutes because of a signal failure.",
        "A signalling fault made the Hamburg train arrive about 40 minutes late.",
    ),
    (
        "She planted tomatoes, basil and two rows of lettuce along the south fence.",
        "Along the southern fence she grew lettuce, tomatoes and basil.",
    ),
    (
        "Our quarterly revenue grew by twelve percent, mostly thanks to the new subscription plan.",
        "The subscription offering drove a 12% rise in sales this quarter.",
    ),
    (
        "The museum closes early on Sundays, so arrive before three if you want to see the mosaics.",
        "On Sunday the museum shuts early; come before 3 pm to view the mosaics.",
    ),
    (
        "A dropped null check in the parser caused the service to crash on empty requests.",
        "The server crashed on blank requests because the parser no longer checked for null.",
    ),
    (
        "Whales communicate across hundreds of kilometres using low-frequency songs.",
        "Low-pitched whale songs carry messages over very long distances.",
    ),
    (
        "He forgot his umbrella and arrived at the interview completely soaked.",
        "Without an umbrella, he got drenched on the way to his job interview.",
    ),
    (
        "The recipe calls for two cups of flour, one egg and a pinch of salt.",
        "You need 2 cups of flour, an egg, and a little salt for this recipe.",
    ),
    (
        "Remote work has changed how many companies think about office space.",
        "Working from home has made firms rethink their need for offices.",
    ),
    (
        "The children built a snowman with a carrot nose and pebble eyes.",
        "The kids made a snowman, giving it stones for eyes and a carrot for a nose.",
    ),
    (
        "Please restart your router if the connection keeps dropping.",
        "If your internet keeps disconnecting, try rebooting the router.",
    ),
    (
        "The volcano erupted overnight, covering nearby villages in ash.",
        "Nearby villages were blanketed with ash after the overnight eruption.",
    ),
    (
        "Regular exercise lowers the risk of heart disease and improves sleep.",
        "Working out often helps you sleep better and protects your heart.",
    ),
    (
        "The committee postponed its decision until more data is available.",
        "The panel delayed the ruling while waiting for further figures.",
    ),
    (
        "My grandmother still writes letters by hand to her friends abroad.",
        "Grandma keeps sending handwritten letters to friends in other countries.",
    ),
    (
        "The bridge will be closed for repairs from Monday to Friday next week.",
        "Repair work shuts the bridge for the whole working week starting Monday.",
    ),
    (
        "Battery life on the new phone is noticeably worse than on the old model.",
        "The latest phone's battery drains faster than its predecessor's.",
    ),
    (
        "They hiked to the summit at dawn and watched the clouds below them.",
        "At sunrise they climbed to the top and looked down on the clouds.",
    ),
    (
        "The library lends out telescopes as well as books.",
        "You can borrow a telescope from the library, not only books.",
    ),
    (
        "Inflation eased slightly in March, but food prices remained high.",
        "In March inflation dipped a little while groceries stayed expensive.",
    ),
    (
        "The cat knocked a glass off the table and then looked at me as if nothing happened.",
        "After pushing a glass onto the floor, the cat stared at me innocently.",
    ),
    (
        "A good night's sleep improves memory and concentration.",
        "Sleeping well helps you remember things and stay focused.",
    ),
    (
        "The software update fixes a security vulnerability in the login page.",
        "This patch closes a security hole on the sign-in screen.",
    ),
    (
        "Farmers are worried that the drought will ruin this year's wheat harvest.",
        "The dry spell may destroy the wheat crop, growers fear.",
    ),
    (
        "He learned to play the violin at the age of forty.",
        "He only started violin lessons when he was 40.",
    ),
    (
        "Electric cars are becoming cheaper as battery costs fall.",
        "Falling battery prices are making EVs more affordable.",
    ),
    (
        "The meeting was moved to the small conference room on the third floor.",
        "We're now meeting in the little conference room upstairs on level three.",
    ),
    (
        "The novel follows three sisters who inherit a failing vineyard.",
        "It's a book about three sisters taking over a vineyard in trouble.",
    ),
    (
        "Don't forget to water the plants while I'm away.",
        "Please remember to water my plants when I'm gone.",
    ),
    (
        "The stadium was packed for the final match of the season.",
        "The last game of the season drew a full stadium.",
    ),
    (
        "Scientists discovered a new species of frog in the rainforest.",
        "Researchers found a previously unknown frog in the jungle.",
    ),
    (
        "The printer on the second floor is out of toner again.",
        "Once more, the upstairs printer has run out of toner.",
    ),
    (
        "Traffic was light this morning, so I got to work early.",
        "With few cars on the road today, I arrived at the office ahead of time.",
    ),
    (
        "The bakery on the corner sells the best croissants in town.",
        "You'll find the town's finest croissants at the corner bakery.",
    ),
    (
        "Our flight was cancelled, and the airline booked us on the next morning's plane.",
        "The airline rebooked us for the following morning after cancelling our flight.",
    ),
    (
        "The river flooded after three days of heavy rain.",
        "Three days of downpour made the river burst its banks.",
    ),
    (
        "Learning a second language is easier when you practise every day.",
        "Daily practice makes picking up another language simpler.",
    ),
    (
        "The doctor recommended rest and plenty of fluids.",
        "My physician told me to rest and drink a lot.",
    ),
    (
        "A power outage left thousands of homes without electricity overnight.",
        "Thousands of households had no power through the night after a blackout.",
    ),
    (
        "The startup raised ten million dollars to expand into Asia.",
        "The young company secured $10M to grow in Asian markets.",
    ),
    (
        "How do I reset my password if I no longer have access to my email?",
        "I lost access to my email account; how can I change my password?",
    ),
    (
        "What time does the pharmacy open on Saturdays?",
        "When does the chemist open at the weekend?",
    ),
    (
        "Is it safe to swim in the lake after a storm?",
        "Can you swim in the lake safely right after a thunderstorm?",
    ),
    (
        "Why does bread go stale faster in the fridge?",
        "What makes refrigerated bread dry out more quickly?",
    ),
    (
        "Where can I find the nearest charging station for my car?",
        "Which EV charger is closest to me?",
    ),
    ("How many people live in Tokyo?", "What is the population of Tokyo?"),
    (
        "Which programming language should I learn first?",
        "What is the best first language for a beginner programmer?",
    ),
    ("Can dogs eat grapes?", "Are grapes safe for dogs?"),
    (
        "What is the difference between weather and climate?",
        "How does climate differ from weather?",
    ),
    ("How long does it take to boil an egg?", "For how many minutes should an egg be boiled?"),
    (
        "The orchestra rehearsed the symphony for weeks before the premiere.",
        "Before opening night, the orchestra practised the symphony for many weeks.",
    ),
    (
        "Coral reefs are bleaching because ocean temperatures keep rising.",
        "Warming seas are causing reefs to lose their colour.",
    ),
    (
        "The new bike lane made cycling to school much safer.",
        "Riding a bicycle to school is safer since the bike path was built.",
    ),
    (
        "He apologised for the misunderstanding and offered a refund.",
        "He said sorry for the confusion and proposed to give the money back.",
    ),
    (
        "The garden is full of bees now that the lavender is in bloom.",
        "With the lavender flowering, bees are everywhere in the garden.",
    ),
    (
        "Our team missed the deadline because the requirements kept changing.",
        "Shifting requirements made our team miss the due date.",
    ),
    (
        "The café offers free refills on filter coffee.",
        "Filter coffee refills are free at the café.",
    ),
    (
        "Astronomers observed a comet passing close to the sun.",
        "A comet was seen by astronomers as it swept near the sun.",
    ),
    (
        "The landlord promised to fix the heating before winter.",
        "Before the cold season, the landlord said he'd repair the heater.",
    ),
    (
        "Most of the town's shops are closed on public holidays.",
        "On bank holidays nearly every shop in town is shut.",
    ),
    (
        "Der Zug nach München fährt heute von Gleis sieben ab.",
        "Heute startet der Zug Richtung München auf Gleis 7.",
    ),
    (
        "Ich habe meinen Schlüssel im Büro vergessen.",
        "Mein Schlüssel liegt noch im Büro, ich habe ihn vergessen.",
    ),
    (
        "Le musée est fermé le mardi et ouvert tous les autres jours.",
        "Sauf le mardi, le musée ouvre chaque jour.",
    ),
    (
        "Il pleut depuis ce matin et les rues sont inondées.",
        "Depuis le matin, la pluie a inondé les rues.",
    ),
    (
        "El mercado central abre a las ocho de la mañana.",
        "El mercado principal abre a las 8 de la mañana.",
    ),
    (
        "Mi hermana trabaja como enfermera en un hospital de Madrid.",
        "Mi hermana es enfermera en un hospital madrileño.",
    ),
    (
        "La pizza napoletana ha un bordo alto e morbido.",
        "La pizza di Napoli ha il cornicione alto e soffice.",
    ),
    (
        "O restaurante fica perto da praia e serve peixe fresco.",
        "Perto da praia há um restaurante com peixe fresco.",
    ),
    (
        "De fiets staat achter het huis bij de schuur.",
        "Achter het huis, naast de schuur, staat de fiets.",
    ),
    ("北京的冬天很冷，但是很少下雪。", "北京冬天天气寒冷，不过雪不多。"),
    ("我明天早上要去图书馆还书。", "明早我得去图书馆把书还了。"),
    ("東京の桜は三月の終わりに咲きます。", "東京では三月末に桜が咲く。"),
    ("駅までは歩いて十分ぐらいです。", "駅へは徒歩でおよそ十分かかります。"),
    ("Москва — самый большой город России.", "Крупнейший город России — Москва."),
    ("Я люблю читать книги по вечерам.", "По вечерам мне нравится читать."),
    ("القهوة العربية تقدم عادة مع التمر.", "عادة ما تقدم القهوة العربية مع التمر."),
    ("def add(a, b): return a + b", "a Python function that returns the sum of two numbers"),
    (
        "SELECT name, email FROM users WHERE active = 1 ORDER BY name;",
        "SQL query listing active users' names and emails sorted by name",
    ),
    (
        "for (int i = 0; i < n; ++i) { sum += values[i]; }",
        "C loop adding up every element of an array",
    ),
    (
        "git commit -m 'Fix off-by-one error in pagination'",
        "commit a fix for an off by one bug in paging with git",
    ),
    (
        "The package costs €49.99 and ships within 3 business days.",
        "Price is 49,99 euros, delivered in three working days.",
    ),
    (
        "The meeting starts at 09:30 on 14 March 2025.",
        "The meeting begins at half past nine on March 14th, 2025.",
    ),
    ("Mount Everest is 8,849 metres high.", "Everest reaches a height of 8849 m."),
    (
        "Water boils at 100 °C at sea level.",
        "At sea level, water boils at one hundred degrees Celsius.",
    ),
    (
        "Our office is at 221B Baker Street, London NW1 6XE.",
        "The office address is 221B Baker St, London.",
    ),
    (
        "Visit https://example.org/help for installation instructions.",
        "Installation help is available on the example.org help page.",
    ),
    ("I'm so happy today 😊🎉", "Feeling really joyful right now 😄"),
    (
        "The sunset over the harbour was breathtaking.",
        "The sun going down over the port was stunning.",
    ),
    (
        "A fox crossed the road in front of our car last night.",
        "Last night a fox ran across the street ahead of our car.",
    ),
    (
        "The conference will be held online this year.",
        "This year's conference takes place virtually.",
    ),
    (
        "Smoking is not allowed anywhere on the premises.",
        "No smoking is permitted on the property.",
    ),
    (
        "The kettle switches itself off when the water boils.",
        "Once the water is boiling, the kettle turns off automatically.",
    ),
    (
        "Our neighbours adopted a puppy from the shelter.",
        "The people next door got a young dog from the animal shelter.",
    ),
    (
        "The exam results will be published on Friday afternoon.",
        "Test scores come out on Friday after lunch.",
    ),
    (
        "The hotel room had a view of the mountains.",
        "From our hotel room we could see the mountains.",
    ),
    (
        "Wind turbines now supply a third of the country's electricity.",
        "A third of the nation's power comes from wind farms.",
    ),
    (
        "The actor forgot his lines during the opening night.",
        "On the first night, the actor blanked on his lines.",
    ),
    (
        "I usually take the bus to work, but today I walked.",
        "Normally I commute by bus; this time I went on foot.",
    ),
    (
        "The ice on the pond is too thin to walk on.",
        "Don't step onto the pond; the ice isn't thick enough.",
    ),
    (
        "Thousands of people marched through the capital to demand climate action.",
        "A large crowd protested in the capital calling for action on climate change.",
    ),
]

# ---------------------------------------------------------------- English
ENGLISH = [
    "Most mornings begin with a cup of tea and the news on the radio.",
    "The elevator has been out of order since Tuesday.",
    "It took the team six months to migrate the database without downtime.",
    "The old lighthouse is now a small museum about shipwrecks.",
    "Please keep your luggage with you at all times.",
    "She won the chess tournament without losing a single game.",
    "Honey never spoils if it is stored in a sealed jar.",
    "The wind was so strong that the ferry stayed in port.",
    "Our dishwasher makes a strange grinding noise when it drains.",
    "He speaks four languages but still struggles with spelling.",
    "The documentary explains how glaciers carve valleys over millennia.",
    "Some birds can sleep with one half of their brain at a time.",
    "The bakery sold out of sourdough before nine o'clock.",
    "Nobody noticed that the clock in the hall had stopped.",
    "I'd rather stay home tonight and finish my book.",
    "The invoice was sent to the wrong address twice.",
    "Tall grass and wildflowers have taken over the abandoned railway.",
    "The surgeon explained the procedure in simple terms.",
    "Every spring the town holds a festival for its patron saint.",
    "The keyboard is missing the letter Q.",
    "A thunderstorm knocked out the traffic lights downtown.",
    "My laptop fan spins loudly whenever I open a video call.",
    "Volunteers cleaned two tons of plastic from the beach.",
    "The recipe was passed down through five generations.",
    "The team celebrated the launch with pizza and cake.",
    "His handwriting is so small that I need a magnifying glass.",
    "The contract expires at the end of the year unless we renew it.",
    "Penguins huddle together to survive the Antarctic winter.",
    "The queue outside the concert hall stretched around the block.",
    "I can't remember where I parked the car.",
    "The painter mixed blue and yellow to get the exact shade of green.",
    "A rainbow appeared just as the rain stopped.",
    "The students debated whether homework should be abolished.",
    "Cheese from this valley has been made the same way for centuries.",
    "The tram line will be extended to the airport by 2027.",
    "My brother collects vintage postcards from seaside towns.",
    "The soup needs more salt, and perhaps a little pepper.",
    "An anonymous donor paid for the new playground.",
    "The lecture was recorded for students who could not attend.",
    "Our cat refuses to eat anything except one brand of food.",
    "The referee's decision was heavily criticised after the match.",
    "The hospital opened a new wing for children.",
    "The password must contain at least twelve characters.",
    "Mushrooms appeared all over the lawn after the rain.",
    "She keeps a diary in which she writes three lines every night.",
    "The merger still needs approval from the competition authority.",
    "A swarm of starlings formed shifting shapes in the evening sky.",
    "We painted the kitchen a warm yellow.",
    "The app crashes when you rotate the screen.",
    "This bread is made with rye, caraway and a long fermentation.",
    "The bus driver waited for the old man to sit down before pulling away.",
    "The city council voted to ban cars from the old town.",
    "Tides are caused mainly by the gravitational pull of the moon.",
    "The kids are building a treehouse in the backyard.",
    "He quit his job in finance to become a carpenter.",
    "The storm uprooted the oak tree that had stood there for two hundred years.",
    "I left a voicemail, but nobody called back.",
    "The gallery is showing photographs of deserted factories.",
    "Bees communicate the location of flowers by dancing.",
    "The printer jammed halfway through the report.",
    "Our street is being resurfaced, so parking is limited.",
    "The translation lost much of the humour of the original.",
    "The ship's captain announced that we would dock an hour late.",
    "Fresh snow makes the whole town very quiet.",
    "She fixed the leaking tap with a new washer.",
    "The experiment had to be repeated because the samples were contaminated.",
    "The elderly couple dance together every Saturday night.",
    "Two goals in the last five minutes changed the outcome of the game.",
    "The startup's office is a converted warehouse by the canal.",
    "A pair of herons nests on the island in the middle of the lake.",
    "Learning to code taught me to break problems into smaller parts.",
    "The ferry crossing takes about ninety minutes in calm weather.",
    "He always reads the last page of a novel first.",
    "The bakery uses flour milled in the next village.",
    "The power cable is too short to reach the socket.",
    "The choir sang in a cathedral with a five-second echo.",
    "Most of the apples fell before we could pick them.",
    "The interview was conducted over a crackling phone line.",
    "A retired teacher runs the village's free maths club.",
    "The train was so crowded that people stood in the corridors.",
    "Forecasters expect the heatwave to last until the weekend.",
    "The umbrella turned inside out in the first gust of wind.",
    "The company recalled thousands of kettles with faulty switches.",
    "The desert blooms for a few weeks after rare spring rains.",
    "Our landlord raised the rent by eight percent.",
    "A missing semicolon broke the entire build.",
    "The toddler insisted on wearing rain boots on a sunny day.",
    "The old map showed a road that no longer exists.",
    "He ran the marathon in just under four hours.",
    "The mayor cut the ribbon to open the new library.",
    "The plane circled the airport for half an hour before landing.",
    "Our neighbour's rooster starts crowing at four in the morning.",
    "The play was cancelled after the lead actor fell ill.",
    "Moss grows thickest on the shady side of the wall.",
    "The database backup runs every night at two.",
    "A stray dog followed us all the way home.",
    "The museum's most famous painting is smaller than people expect.",
    "I prefer paper books to e-readers.",
    "The negotiations broke down over a single clause.",
    "The vineyard terraces climb steeply above the river.",
    "She trained her parrot to whistle the national anthem.",
    "The sandwich shop closes when the bread runs out.",
    "The kids spent the whole afternoon jumping in puddles.",
    "Heavy fog delayed flights across the region.",
    "The tailor shortened the trousers by two centimetres.",
    "The evening news opened with the election results.",
    "A single candle lit the tiny room.",
    "The bridge sways slightly when a lot of people walk on it.",
    "The spreadsheet has formulas that nobody understands anymore.",
    "Wolves have returned to the forests after a century of absence.",
    "Her grandfather repaired clocks in a workshop behind the house.",
    "The cake collapsed because the oven door was opened too soon.",
    "The server room must stay below twenty-five degrees.",
    "The village has one shop, one pub and one bus a day.",
    "We argued for an hour about which film to watch.",
    "The new policy allows employees to work four longer days a week.",
    "Ancient Romans used volcanic ash to make durable concrete.",
    "The hikers got lost when the trail markings disappeared.",
    "The violinist played an encore that lasted longer than the concerto.",
    "The kids' drawings cover every inch of the fridge door.",
    "The microwave beeps three times when the food is ready.",
    "Sea otters hold hands while they sleep so they don't drift apart.",
    "That joke was funnier the first time you told it.",
    "The journalist protected her source despite pressure from the court.",
    "Our garden hose sprang a leak right at the tap.",
    "The photographer waited hours for the light to change.",
    "The tea plantation lies on misty hills above the town.",
    "A typo in the headline made the front page famous.",
    "The recycling is collected every second Thursday.",
    "He trains every morning before the sun comes up.",
    "The pilot thanked passengers for their patience.",
    "A new study links air pollution to poor sleep.",
    "The bookshop has a cat that sleeps in the window.",
    "My phone screen cracked when it fell off the sofa.",
    "The festival attracts jugglers, musicians and fire-eaters.",
    "The firefighters rescued a kitten from a drainpipe.",
    "Snowdrops are usually the first flowers of the year.",
    "The bill was split evenly between the six of us.",
    "The theory was elegant but did not survive the first experiment.",
    "Our router blinks orange whenever the connection drops.",
    "The chef insists that pasta water should taste like the sea.",
    "The puppy chewed through the charger cable.",
    "The road to the monastery is closed in winter.",
    "They renovated the farmhouse using only local stone.",
    "The lecture hall fell silent when the fire alarm stopped.",
    "Please turn off the lights when you leave the room.",
    "The cello was older than the country it was played in.",
    "Nobody expected the underdog to win the championship.",
]

QUESTIONS = [
    "Why is the sky blue?",
    "Who wrote the letter that was found in the attic?",
    "Could you send me the slides from yesterday's talk?",
    "Does this train stop at the airport?",
    "What happens if I miss the last bus?",
    "Is there a vegetarian option on the menu?",
    "How far is the nearest hospital from here?",
    "Do you know whether the shop accepts cards?",
    "When was the cathedral built?",
    "Would it be possible to postpone the meeting until Thursday?",
    "What is the capital of Australia?",
    "How do airplanes stay in the air?",
    "Which planet has the most moons?",
    "Have you ever tried cooking with lemongrass?",
    "Why do cats purr?",
    "How much sugar is too much sugar?",
    "Can I bring my dog on the train?",
    "What does the error code 0x80070005 mean?",
    "Where did I put my glasses?",
    "Are you coming to the party on Saturday or not?",
    "Who is responsible for maintaining the shared printer?",
    "How can I tell if an avocado is ripe?",
    "Why does my code work on my laptop but not on the server?",
    "What should I pack for a week in Iceland in October?",
    "Is it true that goldfish have a three-second memory?",
]

SHORT = [
    "Hello",
    "yes",
    "No.",
    "ok",
    "Thanks!",
    "Goodbye",
    "Why?",
    "42",
    "cat",
    "Stop",
    "wow",
    "?",
    "...",
    "Merci",
    "Danke",
    "Hola",
    "Ciao",
    "猫",
    "ありがとう",
    "Привет",
    "مرحبا",
    "🙂",
    "🚀🚀🚀",
    "été",
    "naïve",
    "pneumonoultramicroscopicsilicovolcanoconiosis",
    "Delicious.",
    "Maybe later",
    "Good morning",
    "Happy birthday!",
    "Out of stock",
    "Try again",
    "404",
    "NaN",
    "x",
]

# ---------------------------------------------------------------- other languages
OTHER = [
    # German
    "Das Wetter soll am Wochenende endlich besser werden.",
    "Kannst du mir bitte das Salz reichen?",
    "Die Bibliothek bleibt wegen Renovierungsarbeiten bis Ende Mai geschlossen.",
    "Unser Nachbar repariert sein Fahrrad jeden Samstag im Hof.",
    "Die Besprechung wurde auf nächsten Dienstag verschoben.",
    "Im Herbst sammeln wir Pilze im Wald hinter dem Dorf.",
    "Wie viel kostet eine Fahrkarte nach Berlin?",
    "Die Straßenbahn kommt alle zehn Minuten.",
    "Donaudampfschifffahrtsgesellschaftskapitänsmütze",
    "Nach dem Gewitter roch die Luft nach nassem Gras und Erde.",
    # French
    "Je voudrais réserver une table pour quatre personnes ce soir.",
    "Le boulanger ouvre sa boutique à six heures du matin.",
    "Nous avons visité les châteaux de la Loire pendant les vacances.",
    "Où se trouve la gare la plus proche ?",
    "Les enfants jouent dans le parc après l'école.",
    "Ce fromage est fabriqué à partir de lait de brebis.",
    "Il faut composter son billet avant de monter dans le train.",
    "La réunion a duré trois heures sans la moindre pause.",
    "Qu'est-ce que tu fais ce week-end ?",
    "L'hiver dernier, le lac était entièrement gelé.",
    # Spanish
    "¿Dónde está la parada de autobús más cercana?",
    "Mañana vamos a la playa si no llueve.",
    "La catedral tardó más de dos siglos en construirse.",
    "Me encanta el olor del café recién hecho.",
    "El tren de alta velocidad une Madrid y Sevilla en dos horas y media.",
    "Los niños aprendieron a nadar este verano.",
    "Necesito cambiar la batería del coche antes del invierno.",
    "¡Qué sorpresa verte por aquí!",
    "La abuela prepara paella todos los domingos.",
    # Italian
    "Il treno per Firenze parte dal binario tre.",
    "Vorrei un caffè e un cornetto, per favore.",
    "La mostra resterà aperta fino alla fine di settembre.",
    "Abbiamo camminato lungo il fiume fino al tramonto.",
    "Quanto costa questo libro?",
    "Le strade di Venezia sono piene di turisti in estate.",
    "Mio nonno coltiva olive e produce il suo olio.",
    "Domani sera andiamo a teatro.",
    # Portuguese
    "O ônibus para o centro passa a cada quinze minutos.",
    "Gostaria de experimentar este prato típico.",
    "A festa começou tarde e terminou de madrugada.",
    "Você sabe onde fica a farmácia?",
    "Lisboa é conhecida pelos seus elétricos amarelos.",
    "Choveu o dia inteiro e o jogo foi adiado.",
    "As aulas recomeçam na segunda-feira.",
    # Dutch
    "Het regent al de hele dag in Amsterdam.",
    "Wil je een kopje koffie of thee?",
    "De winkel is op zondag gesloten.",
    "We fietsen elke ochtend naar het station.",
    "Het museum heeft een nieuwe tentoonstelling over Vermeer.",
    "Hoe laat vertrekt de laatste trein naar Utrecht?",
    # Swedish, Danish, Norwegian, Finnish, Polish, Czech, Turkish, Greek
    "Vi ses i morgon vid busshållplatsen.",
    "Det er koldt i dag, så tag en varm jakke på.",
    "Jeg liker å gå på ski om vinteren.",
    "Hyvää huomenta! Mitä kuuluu?",
    "Dzień dobry, czy mogę zapłacić kartą?",
    "Praha je krásné město s mnoha mosty.",
    "Bu akşam arkadaşlarımla sinemaya gideceğim.",
    "Η θάλασσα ήταν πολύ ζεστή σήμερα.",
    "Καλημέρα, πώς είστε;",
    # Chinese
    "今天天气很好，我们去公园散步吧。",
    "这家餐厅的饺子特别好吃。",
    "请问地铁站怎么走？",
    "他每天早上六点起床跑步。",
    "这本书我已经读了三遍了。",
    "上海是中国最大的城市之一。",
    "我们下周五开会讨论新的项目计划。",
    "春节的时候，家家户户都贴春联。",
    "手机没电了，你有充电器吗？",
    "学习一门新的语言需要耐心和时间。",
    # Japanese
    "今日はとても暑いですね。",
    "この電車は新宿に止まりますか？",
    "週末は友達と京都へ行きました。",
    "日本語を勉強して二年になります。",
    "すみません、トイレはどこですか？",
    "昨日の夜、地震がありました。",
    "ラーメンを食べに行きませんか？",
    "富士山は日本で一番高い山です。",
    # Korean
    "오늘 날씨가 정말 좋네요.",
    "지하철역이 어디에 있어요?",
    "저는 커피보다 차를 더 좋아해요.",
    "서울은 밤에도 아주 밝아요.",
    # Russian, Ukrainian
    "Поезд прибывает на второй путь через пять минут.",
    "Завтра будет дождь, возьми зонт.",
    "Сколько стоит билет в музей?",
    "Зимой в Сибири бывает очень холодно.",
    "Мы встретились в кафе возле университета.",
    "Этот рецепт передавался в нашей семье из поколения в поколение.",
    "Київ стоїть на берегах Дніпра.",
    # Arabic, Hebrew, Persian
    "أين تقع محطة القطار؟",
    "الطقس جميل اليوم ونريد أن نذهب إلى البحر.",
    "أحب قراءة الكتب في المساء.",
    "افتتحت المكتبة الجديدة في وسط المدينة.",
    "كم سعر هذا القميص؟",
    "שלום, מה שלומך היום?",
    "امروز هوا خیلی سرد است.",
    # Hindi, Thai, Vietnamese, Indonesian, Swahili
    "मुझे चाय बहुत पसंद है।",
    "दिल्ली में आज बहुत गर्मी है।",
    "วันนี้อากาศดีมาก",
    "Tôi thích ăn phở vào buổi sáng.",
    "Saya akan pergi ke pasar besok pagi.",
    "Habari za asubuhi? Nzuri sana, asante.",
    # mixed scripts in one sentence
    "The word for cat is Katze in German, 猫 in Japanese and кошка in Russian.",
    "Our Tokyo office (東京オフィス) opens on Monday, 月曜日.",
    "She said «bonjour», he replied „guten Tag“, and everyone laughed.",
]

# ---------------------------------------------------------------- code and markup
CODE = [
    "import numpy as np",
    "x = np.linspace(0, 2 * np.pi, 100); y = np.sin(x)",
    "if not items: raise ValueError('items must not be empty')",
    "with open(path, encoding='utf-8') as f: lines = f.read().splitlines()",
    "class Point: __slots__ = ('x', 'y')",
    "lambda s: s.strip().lower()",
    "print(f'{name!r} has {len(values)} values, mean {sum(values) / len(values):.3f}')",
    "const total = items.reduce((acc, item) => acc + item.price * item.qty, 0);",
    "document.querySelector('#submit').addEventListener('click', onSubmit);",
    'export default function App() { return <div className="app">Hello</div>; }',
    "async function load(url) { const r = await fetch(url); return r.json(); }",
    "#include <stdio.h>",
    'int main(void) { printf("hello, world\\n"); return 0; }',
    "std::vector<float> out(n, 0.0f);",
    "template <typename T> T clamp(T v, T lo, T hi) { return v < lo ? lo : (v > hi ? hi : v); }",
    'fn main() { let v: Vec<i32> = (1..=10).map(|x| x * x).collect(); println!("{:?}", v); }',
    'func handler(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") }',
    'public static void main(String[] args) { System.out.println("Hi"); }',
    "SELECT country, COUNT(*) AS n FROM orders GROUP BY country HAVING COUNT(*) > 10;",
    "UPDATE accounts SET balance = balance - 100 WHERE id = 42;",
    "CREATE INDEX idx_users_email ON users (email);",
    "ls -la | grep '.py$' | wc -l",
    "docker run --rm -it -p 8080:80 nginx:latest",
    "pip install --upgrade 'requests>=2.31'",
    "tar -xzf archive.tar.gz -C /tmp/out",
    "curl -s -X POST -H 'Content-Type: application/json' -d '{\"q\": 1}' http://localhost:8000/api",
    '<a href="/about" class="nav-link active">About us</a>',
    '<meta charset="utf-8"><title>Home</title>',
    '{"id": 17, "name": "widget", "tags": ["blue", "small"], "price": 3.5}',
    "key: value  # a YAML comment",
    "^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\\.[a-zA-Z]{2,}$",
    "\\frac{\\partial L}{\\partial w} = \\sum_i (y_i - \\hat{y}_i) x_i",
    "E = mc^2",
    "body { margin: 0; font-family: sans-serif; }",
    "while True: line = sys.stdin.readline(); if not line: break",
    "assert torch.allclose(out, ref, atol=1e-5), (out - ref).abs().max()",
    "df.groupby('region')['sales'].sum().sort_values(ascending=False).head(10)",
    "return [x for x in range(100) if x % 3 == 0 and x % 5 != 0]",
    "Traceback (most recent call last): File \"main.py\", line 12, in <module> KeyError: 'user_id'",
    "error[E0382]: borrow of moved value: `config`",
    "Segmentation fault (core dumped)",
    "WARNING: Retrying (Retry(total=4)) after connection broken by 'ReadTimeoutError'",
]

# ---------------------------------------------------------------- URLs, emoji, punctuation
WEB = [
    "https://www.example.com/products?id=1234&sort=price_desc#reviews",
    "Contact us at support@example.net or call +1 (555) 010-2368.",
    "ftp://files.example.org/pub/releases/v2.13.0/checksums.txt",
    "See http://localhost:3000/dashboard after starting the server.",
    "Follow @example_news and use #ClimateWeek in your posts.",
    "The file lives at C:\\Users\\maria\\Documents\\report_final_v3.docx",
    "mailto:info@example.com?subject=Question%20about%20my%20order",
    "Download it from https://example.io/get and verify the SHA-256 hash.",
    "192.168.1.254 is the default gateway; DNS is 1.1.1.1.",
    "Use the coupon code SPRING-2025-XYZ at checkout.",
]

EMOJI_PUNCT = [
    "Best. Day. Ever!!! 🎉🎉🎉",
    "lol that was sooo funny 😂😂",
    "Coffee ☕ + code 💻 = happiness ❤️",
    "Weather today: ☀️ then 🌧️ then ⛈️",
    "Wait... what?!?",
    "((a + b) * (c - d)) / [e ^ {f}]",
    "***IMPORTANT*** --- read before continuing --- ***IMPORTANT***",
    "Yes/no/maybe; pick one (only one!).",
    '"Quotes," she said, "are \'nested\' sometimes."',
    "It's 5 o'clock somewhere — isn't it?",
    "!!!???!!!",
    "Ready, set... go! 🏃‍♀️💨",
    "Thanks for everything 🙏 see you soon 👋",
    "Pizza 🍕 or sushi 🍣? Both! 😋",
    "#### Section 2.1 ####",
    "-- end of transmission --",
    "a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p",
    "~~~ ~~~ ~~~",
    "@@@ ### $$$ %%% &&&",
    "The flags 🇩🇪 🇫🇷 🇯🇵 🇧🇷 waved in the wind.",
]

# ---------------------------------------------------------------- medium passages
MEDIUM = [
    "The museum reopened after a two-year renovation. Visitors can now walk through a glass tunnel beneath the old courtyard, where archaeologists found the foundations of a Roman bathhouse. The new café on the roof looks out over the cathedral, and entry is free on the first Sunday of every month.",
    "To replace a bicycle inner tube, remove the wheel, let out any remaining air and lever one side of the tyre off the rim. Pull out the old tube, check the inside of the tyre for thorns or glass, then fit the new tube, inflate it slightly and work the tyre back onto the rim with your thumbs.",
    "Dear customer, thank you for your order. Unfortunately one of the items is temporarily out of stock. We will ship the rest of your order today and send the missing item as soon as it arrives, at no extra cost. If you would prefer a refund for that item, simply reply to this email.",
    "Our weekly stand-up covered three topics: the flaky integration test that fails about once in twenty runs, the migration of the billing service to the new message queue, and the on-call rota for the holidays. Action items were assigned to Priya, Marco and the platform team respectively.",
    "Octopuses have three hearts, blue blood and about two thirds of their neurons in their arms. Each arm can taste what it touches and react on its own, which may explain how these animals solve puzzles, open jars and escape from aquarium tanks with surprising ease.",
    "The apartment has two bedrooms, a small balcony facing the courtyard and a kitchen that was renovated last year. Heating is included in the rent, pets are allowed by arrangement, and the nearest underground station is a five-minute walk away. Viewings are possible on weekday evenings.",
    "After the flood, the community centre became a shelter, a kitchen and a warehouse all at once. Volunteers sorted donated clothes, cooked hot meals for two hundred people a day and drove supplies to farms cut off by the water. Three weeks later, most families had returned home.",
    "Release notes: the command line tool now accepts a --dry-run flag, prints progress to standard error instead of standard output, and exits with status 2 on invalid arguments. The configuration file format is unchanged, but the deprecated verbose option has been removed.",
    "The chess club meets every Wednesday evening in the back room of the library. Beginners are welcome, boards and clocks are provided, and once a month the club organises a rapid tournament with small prizes. Last season a twelve-year-old won the championship for the first time.",
    "In the first experiment, participants who slept for eight hours recalled about forty percent more words than those who stayed awake. The effect was smaller for emotional words and disappeared entirely when the test was repeated a week later, which the authors attribute to a ceiling effect.",
    "Les enfants sont rentrés de l'école en courant, ont jeté leurs cartables dans l'entrée et sont repartis aussitôt jouer au ballon dans la cour. Leur grand-mère les a appelés pour le goûter, mais personne n'a répondu avant que le soleil ne se couche derrière les toits.",
    "Am Samstagvormittag ist der Wochenmarkt besonders voll. Die Händler bieten Obst und Gemüse aus der Region an, dazu Käse, Brot, Blumen und frischen Fisch von der Küste. Wer früh kommt, bekommt die besten Erdbeeren, wer spät kommt, oft einen günstigeren Preis.",
    "El pueblo celebra sus fiestas en agosto con música en la plaza, fuegos artificiales y una comida popular en la que participan todos los vecinos. Los jóvenes que viven en la ciudad vuelven esos días, y las calles se llenan de gente hasta altas horas de la noche.",
    "私は毎朝七時に起きて、コーヒーを飲みながらニュースを読みます。それから自転車で会社に行きます。雨の日はバスを使いますが、とても混んでいるので少し大変です。",
    "В субботу мы поехали за город, чтобы собрать грибы. Лес был мокрым после дождя, и за три часа мы набрали две полные корзины. Вечером бабушка пожарила грибы с картошкой, и это был лучший ужин за всё лето.",
    "A well-designed API is easy to use correctly and hard to use incorrectly. Names should say what a function does, arguments should have sensible defaults, errors should explain what went wrong, and the behaviour for empty inputs, very large inputs and unusual types should be documented and tested.",
    "Il weekend scorso siamo andati in montagna con gli amici. Abbiamo dormito in un rifugio a duemila metri, cenato con polenta e formaggio e, la mattina dopo, siamo saliti fino al passo per vedere l'alba sopra le nuvole.",
    "Ontem fomos ao mercado de peixe logo de manhã cedo. Compramos sardinhas, polvo e camarão, e à tarde fizemos um grande almoço no quintal com a família toda, que durou até o anoitecer.",
]

# ---------------------------------------------------------------- long paragraphs
LONG = [
    "The history of the printing press is often told as the story of a single inventor, but the machine that appeared in Mainz in the middle of the fifteenth century brought together many older ideas. Screw presses had been used for centuries to squeeze grapes and olives, paper had travelled from China through the Islamic world to Europe, and oil-based inks were already familiar to painters. What was new was a reliable way to cast large numbers of identical metal letters, together with an ink that stuck to metal and a workflow that let a small team produce hundreds of copies of a page in a day. Within fifty years presses were running in more than two hundred European towns, and the price of books fell so sharply that ordinary merchants could afford them. Scholars argue about how quickly literacy followed, yet nobody doubts that pamphlets, calendars, grammars and maps began to circulate in quantities that would have been unthinkable a generation earlier.",
    "When the team first moved the recommendation service to the new cluster, latency doubled and nobody could explain why. The code was identical, the machines were faster on paper, and the load tests from the week before had looked fine. After two days of staring at dashboards, an engineer noticed that every request was making a synchronous call to a configuration service that lived in another region. On the old cluster that service had been cached locally by a sidecar that nobody remembered installing. Adding the cache back brought latency below its previous level, and the incident review ended with a simple recommendation: write down every dependency, especially the ones that seem too boring to mention. The team also added an alert that fires when cross-region traffic grows by more than a few percent, so the next surprise of this kind will show up within minutes rather than days.",
    "Sourdough starts with nothing more than flour and water left to sit in a warm kitchen. Wild yeasts and lactic acid bacteria that live on the grain and in the air begin to feed on the sugars, and within a week the mixture bubbles, rises and smells pleasantly sour. Bakers keep this culture alive for years by feeding it regularly, and some claim their starter is older than they are. To make a loaf, a portion of the starter is mixed into a larger dough, which then ferments slowly for many hours. The long fermentation develops flavour, makes the bread keep longer and breaks down some of the compounds that people find hard to digest. Shaping, scoring and baking in a very hot oven with plenty of steam give the crust its colour and crackle, while the crumb stays open and moist. It is slow work, but many home bakers find the rhythm of it calming.",
    "Our village sits at the end of a narrow valley, where the road stops and only footpaths continue towards the high pastures. In summer the population triples as hikers arrive, and the single guesthouse is booked months ahead. In winter the pass closes, the school bus becomes a snow tractor, and the baker delivers bread on a sledge. The older residents remember when there was no road at all and supplies came up on the backs of mules. Today there is fibre internet, a small solar farm above the church and a cooperative that sells cheese to shops in the city. Young people still leave to study, but more of them come back than a generation ago, some to run businesses that can be managed from anywhere with a good connection, others to take over the family farms and try new ideas such as raising goats or growing herbs for tea.",
    "Deep-sea hydrothermal vents were discovered in 1977, when a research submarine exploring a rift near the Galápagos Islands found shimmering water and, to the surprise of the scientists on board, dense communities of animals. Giant tube worms, clams and crabs were living in complete darkness, thousands of metres below the surface, far from any sunlight. Their food chain turned out to rest on bacteria that draw energy from chemical reactions involving hydrogen sulphide rather than from photosynthesis. The discovery changed how biologists think about where life can exist and gave new weight to the idea that life on Earth may have begun around such vents. It also sharpened interest in the oceans of icy moons such as Europa and Enceladus, where similar chemistry might be at work beneath kilometres of ice, and where future probes may one day look for signs of life.",
    'Writing good error messages is a skill that most programmers learn slowly and painfully. A message such as "invalid input" tells the user that something went wrong but not what, where or how to fix it. A better message names the value that was rejected, the rule it broke and, when possible, the action that would make it work: "batch_size must be a positive integer, got -3" is short and leaves no doubt. Good messages are also consistent, so that users learn where to look, and they avoid blaming the reader. Some teams review error messages as carefully as code, collect the most frequent ones from support tickets and rewrite them until the tickets stop. The payoff is large, because a clear message at the right moment can save hours of searching through forums, reading source code or waiting for a reply from someone who knows the system better.',
    "The old harbour had been used by fishermen for centuries before the container port opened further down the coast. For a while it seemed the quays would simply decay: warehouses stood empty, the fish market moved to an industrial estate and the last boatyard closed. Then a group of residents formed an association, persuaded the city to lease them one of the sheds for a symbolic rent and opened a workshop where volunteers restored wooden boats. Markets, concerts and a small maritime museum followed. Today the harbour is busy again, though mostly with visitors rather than fish, and the debate has shifted to how to keep it from becoming too expensive for the people who live around it. A recent proposal would reserve some of the renovated buildings for craft workshops and affordable flats, and the association has started collecting the stories of former dock workers before they are lost.",
    "A checkpoint can be loaded in many ways, but the details decide whether the result is trustworthy. The configuration file names the architecture, the number of layers, the hidden size and the vocabulary; the weights file holds tensors whose names and shapes must match that configuration exactly; and the tokenizer files decide how text becomes token ids. A mismatch anywhere can produce a model that runs without complaint and returns numbers that look reasonable but are wrong. That is why careful loaders check every tensor's shape, refuse unknown names instead of ignoring them, compare the tokenizer's output with a reference on a few sentences and report problems in terms that point to the file and field at fault. It is also why a reference run on the original framework, on real sentences and with strict tolerances, belongs in the test suite of any project that claims to reproduce another system's results.",
    "Migratory birds navigate using several cues at once. Many species read the position of the sun and correct for its movement through the day, while night migrants learn the rotation of the stars around the celestial pole when they are young. Some birds can sense the Earth's magnetic field, possibly through light-sensitive proteins in their eyes, and experienced adults also rely on landmarks such as coastlines, rivers and mountain ranges. Smell may help seabirds find their way across open water. Young birds on their first journey often follow an inherited direction and distance, which explains why storms can carry them far off course. Researchers track migrants with tiny radio tags and geolocators that weigh less than a gram, and the data have revealed astonishing feats: a bar-tailed godwit, for example, flew from Alaska to New Zealand without stopping, covering more than eleven thousand kilometres in about eleven days.",
    "The first week in a new city is always the hardest. You do not know which bus goes where, the supermarket shelves are arranged in an order that makes no sense, and every small task, from opening a bank account to buying a phone card, takes three times longer than it should. I kept a notebook during my first month abroad and wrote down every word I had to look up, every mistake I made and every kindness I received from strangers. Reading it a year later, I was surprised by how many of the problems had simply disappeared, not because I solved them but because I stopped noticing them. The notebook also reminded me of the woman at the post office who spent twenty minutes helping me fill in a form, and of the neighbour who left a plate of biscuits at my door with a note that said only welcome, in careful block capitals.",
    "Electric grids were designed around large power stations that produce steady output and can be turned up or down on demand. Wind and solar farms behave differently: their output follows the weather, and they are spread across thousands of sites rather than concentrated in a few. Integrating them requires better forecasts, more transmission lines to move power from windy or sunny regions to cities, and flexible resources that can fill the gaps. Batteries already smooth out short fluctuations and are getting cheaper each year. For longer gaps, grid operators look at pumped hydro storage, interconnections between countries, demand response programmes that pay large consumers to shift their usage, and hydrogen produced when electricity is abundant. None of these is a complete answer on its own, and most plans combine several, but together they make a grid powered mostly by renewables technically possible within a couple of decades.",
    "Der Schwarzwald ist eines der bekanntesten Mittelgebirge Deutschlands und liegt im Südwesten des Landes, zwischen dem Rheintal und der Schwäbischen Alb. Dichte Nadelwälder, tiefe Täler und kleine Dörfer mit großen Bauernhäusern prägen die Landschaft. Im Winter kommen Skifahrer und Langläufer, im Sommer Wanderer und Radfahrer, die auf gut markierten Wegen von Hütte zu Hütte ziehen. Die Region ist auch für ihre Kuckucksuhren, ihren Schinken und die gleichnamige Torte mit Kirschen, Sahne und Schokolade berühmt. In den letzten Jahren haben Stürme und Trockenheit viele Fichten geschädigt, und die Förster setzen nun verstärkt auf Mischwälder mit Buchen, Tannen und Eichen, die besser mit dem Klimawandel zurechtkommen sollen.",
    "La Provence est une région du sud-est de la France connue pour ses champs de lavande, ses villages perchés et ses marchés colorés. En été, la chaleur est intense et le mistral souffle parfois pendant plusieurs jours, chassant les nuages et rendant le ciel d'un bleu profond. Les habitants vivent au rythme des saisons : la récolte des olives en automne, la truffe en hiver, les cerises au printemps et la lavande en juillet. Les visiteurs viennent du monde entier pour découvrir les ruelles d'Aix, le palais des Papes à Avignon ou les calanques près de Marseille, mais beaucoup préfèrent les petites routes de l'arrière-pays, où l'on peut encore trouver des places ombragées et des cafés tranquilles.",
    "La ciudad de Granada, en el sur de España, se encuentra al pie de Sierra Nevada y es famosa por la Alhambra, un conjunto de palacios y jardines construido por los reyes nazaríes entre los siglos trece y quince. Sus salas están decoradas con azulejos, yeserías finísimas y techos de madera tallada, y el agua de fuentes y acequias recorre los patios. Además de monumentos, Granada ofrece barrios llenos de vida como el Albaicín, con sus calles estrechas y blancas, y el Sacromonte, donde muchas familias vivían en cuevas excavadas en la colina. En muchos bares todavía se sirve una tapa gratis con cada bebida, una costumbre que los estudiantes de la universidad aprecian especialmente.",
    "长城是中国古代的伟大工程之一，它东起山海关，西至嘉峪关，全长数千公里。长城最早修建于春秋战国时期，后来秦朝把各国的城墙连接起来，明朝又进行了大规模的重建。今天我们看到的大部分城墙都是明代留下来的。长城不仅是军事防御工程，也是中华民族的象征。每年都有成千上万的游客来到八达岭、慕田峪等地参观。站在城墙上远眺，连绵的群山和蜿蜒的城墙让人感受到历史的厚重。",
    "Байкал — самое глубокое озеро на планете и крупнейший природный резервуар пресной воды. Его глубина превышает полторы тысячи метров, а возраст оценивается в двадцать пять миллионов лет. В озере обитают сотни видов животных и растений, которые больше нигде не встречаются, в том числе байкальская нерпа. Зимой лёд становится настолько прозрачным и толстым, что по нему ездят машины, а туристы приезжают посмотреть на трещины и пузырьки, застывшие во льду. Учёные внимательно следят за состоянием воды, потому что загрязнение и изменение климата угрожают уникальной экосистеме.",
]

# ---------------------------------------------------------------- templated items
FIRST = ["Anna", "Ravi", "Mei", "Jonas", "Fatima", "Lucas", "Olga", "Kwame", "Sofia", "Tom"]
CITIES = ["Berlin", "Osaka", "Lagos", "Lima", "Oslo", "Pune", "Quebec", "Seville", "Hanoi", "Perth"]
ITEMS = ["notebooks", "USB cables", "coffee mugs", "bike lights", "tea towels", "batteries"]
UNITS_TEMPLATES = [
    "The parcel weighs {a}.{b} kg and measures {c} × {d} × {e} cm.",
    "Set the oven to {t} °C ({f} °F) and bake for {m} minutes.",
    "The car used {a}.{b} litres per 100 km over {c} km.",
    "Flight {code}{n} to {city} departs at {hh:02d}:{mm:02d} from gate {g}.",
    "Invoice #{n}: {q} × {item} at ${p}.{cents:02d} each, total ${tot:,}.{cents2:02d}.",
    "{name} was born on {dd:02d}/{mo:02d}/{year} in {city}.",
    "On {year}-{mo:02d}-{dd:02d} the temperature in {city} reached {t} °C.",
    "The population of the district grew from {a:,} to {big:,} between {year} and {year2}.",
    "Your appointment is on {weekday}, {month} {dd}, at {hh}:{mm:02d} {ampm}.",
    "The recipe needs {q}/4 cup of sugar, {c} g of butter and {a} eggs.",
    "Download speed: {a}.{b} MB/s, upload: {c}.{e} MB/s, ping: {m} ms.",
    "{name} ran {a}.{b} km in {m}:{mm:02d} and burned {big2} kcal.",
    "Order {code}-{n}-{g} shipped on {dd}.{mo:02d}.{year}; tracking number {track}.",
    "The loan of €{big:,} at {a}.{b}% over {c} years costs €{p},{cents:02d} a month.",
    "Version {a}.{c}.{b} fixes {q} bugs and adds {e} new features.",
    "Call +{cc} {n} {track4} between {hh}:00 and {hh2}:00.",
]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "March", "April", "June", "August", "October", "November", "December"]

LOG_TEMPLATES = [
    "{year}-{mo:02d}-{dd:02d}T{hh:02d}:{mm:02d}:{ss:02d}Z INFO worker-{g} processed {big:,} records in {a}.{b} s",
    "{year}-{mo:02d}-{dd:02d} {hh:02d}:{mm:02d}:{ss:02d},{ms:03d} ERROR [db-pool] connection to 10.0.{g}.{n2} refused after {q} retries",
    "[{hh:02d}:{mm:02d}:{ss:02d}] WARN GC pause {m} ms, heap {a}.{b} GB / {c} GB",
    "GET /api/v{q}/items/{n}?page={g} HTTP/1.1 {status} {big2} bytes {m} ms",
]


def _fill(template: str, rng: random.Random) -> str:
    values = dict(
        a=rng.randint(1, 99),
        b=rng.randint(0, 9),
        c=rng.randint(2, 80),
        d=rng.randint(5, 60),
        e=rng.randint(1, 9),
        t=rng.choice([160, 180, 200, 220, -4, 31, 38, 42]),
        f=rng.choice([320, 356, 392, 428]),
        m=rng.randint(3, 59),
        code=rng.choice(["LH", "BA", "NH", "AF", "QR", "KL"]),
        n=rng.randint(100, 9999),
        n2=rng.randint(2, 250),
        city=rng.choice(CITIES),
        hh=rng.randint(1, 12),
        hh2=rng.randint(13, 20),
        mm=rng.randint(0, 59),
        ss=rng.randint(0, 59),
        ms=rng.randint(0, 999),
        g=rng.randint(1, 40),
        q=rng.randint(1, 3),
        item=rng.choice(ITEMS),
        p=rng.randint(2, 1900),
        cents=rng.randint(0, 99),
        cents2=rng.randint(0, 99),
        tot=rng.randint(20, 250000),
        name=rng.choice(FIRST),
        dd=rng.randint(1, 28),
        mo=rng.randint(1, 12),
        year=rng.randint(1950, 2026),
        year2=rng.randint(2027, 2040),
        big=rng.randint(10000, 9000000),
        big2=rng.randint(120, 99999),
        weekday=rng.choice(WEEKDAYS),
        month=rng.choice(MONTHS),
        ampm=rng.choice(["a.m.", "p.m."]),
        track="".join(rng.choice("0123456789ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(14)),
        track4=rng.randint(1000, 9999),
        cc=rng.choice([1, 33, 44, 49, 81, 91]),
        status=rng.choice([200, 200, 201, 304, 404, 500]),
    )
    return template.format(**values)


def _code_block(rng: random.Random, n: int) -> str:
    """Several code lines joined into one long line (a snippet pasted as one text)."""
    return " ".join(rng.sample(CODE, n))


def _csv_block(rng: random.Random, rows: int) -> str:
    header = "date,city,temp_c,rain_mm,wind_kmh"
    body = [
        f"{rng.randint(2000, 2025)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d},"
        f"{rng.choice(CITIES)},{rng.uniform(-15, 40):.1f},{rng.uniform(0, 60):.1f},{rng.randint(0, 90)}"
        for _ in range(rows)
    ]
    return " ".join([header, *body])


def build() -> tuple[list[str], list[str]]:
    rng = random.Random(20260615)
    corpus: list[str] = [s for s, _ in PAIRS]
    corpus += ENGLISH + QUESTIONS + SHORT + OTHER + CODE + WEB + EMOJI_PUNCT + MEDIUM + LONG
    for template in UNITS_TEMPLATES:
        corpus += [_fill(template, rng) for _ in range(3)]
    for template in LOG_TEMPLATES:
        corpus += [_fill(template, rng) for _ in range(3)]
    # long generated items: pasted code, CSV tables, a log excerpt, a multilingual mix
    corpus += [_code_block(rng, n) for n in (3, 4, 6, 9, 12, 14)]
    corpus += [_csv_block(rng, n) for n in (2, 4, 7, 10, 16)]
    corpus += [" ".join(_fill(rng.choice(LOG_TEMPLATES), rng) for _ in range(n)) for n in (2, 3, 4)]
    corpus += [" ".join(rng.sample(OTHER, n)) for n in (3, 5, 7)]
    corpus.append(" ".join(_fill(rng.choice(LOG_TEMPLATES), rng) for _ in range(8)))
    corpus.append(" ".join(rng.sample(OTHER, 12)))
    corpus.append(" ".join(rng.sample(EMOJI_PUNCT, 10)))
    corpus.append(" ".join(rng.sample(QUESTIONS, 14)))
    seen: set[str] = set()
    unique = []
    for text in corpus:
        text = " ".join(text.split())  # one line each, no tabs or newlines
        if text and text not in seen:
            seen.add(text)
            unique.append(text)
    random.Random(7).shuffle(unique)
    queries = [q for _, q in PAIRS]
    return unique, queries


def main() -> None:
    corpus, queries = build()
    (DATA / "accuracy_corpus.txt").write_text("\n".join(corpus) + "\n", encoding="utf-8")
    (DATA / "accuracy_queries.txt").write_text("\n".join(queries) + "\n", encoding="utf-8")
    print(f"{len(corpus)} corpus lines, {len(queries)} queries -> {DATA}")


if __name__ == "__main__":
    main()
